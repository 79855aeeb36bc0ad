// The conformance suite (suite.ts) on the ort backend, within the tolerance it states; then with every size on
// onnxruntime's kernels (no size left to js below ORT_MIN_MACS and ORT_MIN_ELEMENTS): the edges of each native op.
import { conformance } from './suite.ts';

conformance('ort');
conformance('ort', { label: 'ort (every size native)', options: { minMacs: 0, minElements: 0 } });
