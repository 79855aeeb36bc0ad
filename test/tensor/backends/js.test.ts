// The conformance suite (suite.ts) on the js backend, the reference: its own bits, on every run.
import { conformance } from './suite.ts';

conformance('js');
