/** The state the server pushes (types only: nothing of the server is bundled). */
export type { DashboardState, ServingStats } from '../../src/serve/metrics.ts';
export type { JobView, Overview, OverviewEvent } from '../../src/p2p/protocols/control/overview.ts';
export type { PeerRecord } from '../../src/p2p/vocabulary.ts';
export type { HostedModelEntry } from '../../src/p2p/protocols/control/schema.ts';
