/** The network layer: nodes, frames, streams, the shared vocabulary and one folder per protocol. */
export {
  DIAL_TIMEOUT_MS,
  MAX_CONTROL_BYTES,
  MAX_FRAME_BYTES,
  MAX_TENSOR_RANK,
  PING_INTERVAL_MS,
  PING_STREAMS,
  PING_TIMEOUT_MS,
  SEND_CHUNK_BYTES,
  SEND_STALL_MS,
} from './constants.ts';
export { type DialTarget, dialAddrs, dialProtocol, targetName } from './dial.ts';
export { MAX_VALIDATORS, validatorTarget, Validators } from './validators.ts';
export { isWebRTC, pathTo, WEBRTC_DIAL_MS, WEBRTC_RETRY_MS } from './webrtc.ts';
export {
  decodeFrame,
  encodeControl,
  encodeTensor,
  FRAME_CONTROL,
  FRAME_TENSOR,
  type Frame,
  FrameReader,
  WIRE_DTYPES,
  type WireDType,
  type WireTensor,
} from './frames.ts';
export { IDENTITY_FILE, loadOrCreateIdentity } from './identity.ts';
export { createLogger, isLogLevel, LOG_BURST, LOG_LINES_PER_SECOND, type Logger, type LogLevel } from './log.ts';
export { GRAYLIST_AFTER_REJECTS, GRAYLIST_THRESHOLD, gossipScore } from './gossip-score.ts';
export { createNode, DHT_PROTOCOL, MAX_RELAY_RESERVATIONS, type NodeOptions, listenAlso, publicKeyOf, relayListen, signerOf, type TensorLinkNode } from './node.ts';
export { type RelayCircuit, type RelayGate, remoteIp } from './relay-server.ts';
export { PeerRateLimiter } from './rate-limit.ts';
export { isPublicIPv4, reach, type Reach } from './reach.ts';
export { serveStun, stunAnswer, stunMappedAddress, type StunServer, stunServerOf } from './stun.ts';
export { finite, int, list, obj, oneOf, optional, peerIdText, str, strings } from './schema.ts';
export { RequestTable } from './requests.ts';
export { Slots } from './slots.ts';
export { receiveFrames, type SendOptions, sendMessage, sendParts, sendQuietly, traffic } from './stream.ts';
export {
  addTraffic,
  type Capabilities,
  newTraffic,
  newWorkCounters,
  parseAccount,
  parseHeldSections,
  type HeldSection,
  HOST_STATES,
  type HostedSpan,
  hostedJobId,
  hostedModelJob,
  replannedJobId,
  type HostState,
  parseHostedSpans,
  parseModelName,
  parseAddrs,
  parseAssignment,
  parseCapabilities,
  parseJobId,
  parsePeerRecord,
  parseCoordinate,
  type NetworkCoordinate,
  COORDINATE_LIMITS,
  parsePeerTarget,
  parseProximity,
  parseRoles,
  parseStageAssignment,
  parseTraffic,
  parseWorkCounters,
  type PeerRecord,
  type PeerTarget,
  PATH_KINDS,
  type PathKind,
  type Proximity,
  type Role,
  ROLES,
  type StageAssignment,
  type StageSpan,
  type Tier,
  tierOf,
  type Traffic,
  TRAFFIC_KINDS,
  VOCABULARY_LIMITS,
  type WorkCounters,
} from './vocabulary.ts';
export { errorFromWire, errorToWire, isWireError, type WireError } from './wire-errors.ts';
export { fromWire, toWire } from './wire-tensor.ts';
export {
  CONTROL_PROTOCOL,
  MAX_GOSSIP_BYTES,
  MAX_INBOUND_STREAMS,
  MAX_MESSAGES_PER_SECOND,
  PEERS_TOPIC,
  REQUEST_TIMEOUT_MS,
} from './protocols/control/constants.ts';
export { type Handler, serveControl } from './protocols/control/server.ts';
export { request } from './protocols/control/client.ts';
export {
  type Announcement,
  type AuditMessage,
  MAX_ANNOUNCED_PEERS,
  parseAnnounce,
  parseModelsAnswer,
  mergeModelEntries,
  MODEL_HOSTS_PER_ENTRY,
  type HostedModelEntry,
  type ModelHost,
  parseAuditMessage,
  parseCapabilitiesAnswer,
  parseEnvelope,
  parseJobRequest,
  parseStatsAnswer,
  parseStatusAnswer,
  type Stats,
} from './protocols/control/schema.ts';
export {
  MAX_PROBE_STREAMS,
  MIN_MEASURED_BYTES,
  PROBE_BYTES,
  PROBE_PINGS,
  PROBE_PROTOCOL,
  PROBE_TIMEOUT_MS,
  TRAFFIC_WEIGHT,
} from './protocols/probe/constants.ts';
export { probe, roundTrip, serveProbes } from './protocols/probe/probe.ts';
export { type ArrivalMark, ArrivalMeter, foldTransfer, type TransferSample } from './protocols/probe/passive.ts';
export {
  ENDS_FILES, ENDS_PIECE_BYTES, MANIFEST_PAGE_BYTES, MANIFEST_PAGE_ITEMS, MANIFEST_TIMEOUT_MS, MAX_ENDS_FILE_BYTES, PIECE_TIMEOUT_MS,
} from './protocols/ends/constants.ts';
export {
  type EndsFile, type EndsManifestPage, type ManifestEntry, manifestHash, modelHashOf, parseEndsManifestPage, parseEndsPiece,
} from './protocols/ends/schema.ts';
export {
  MAX_RESULT_STREAMS,
  RESULT_PROTOCOL,
} from './protocols/result/constants.ts';
export { parseResult, type ResultMessage } from './protocols/result/schema.ts';
export {
  CHUNK_BYTES,
  MAX_CHUNKS_PER_WEIGHT,
  MAX_KEY_LENGTH,
  MAX_NAME_LENGTH,
  MAX_NAMES,
  MAX_PASSES_WAITING,
  MAX_ROUTE,
  MAX_SESSIONS_PER_JOB,
  MAX_SESSIONS_PER_PEER,
  MAX_STAGE_STREAMS,
  MAX_TENSORS_PER_REQUEST,
  PASS_WAIT_MS,
  SESSION_IDLE_MS,
  STAGE_MESSAGES_PER_SECOND,
  STAGE_PROTOCOL,
  STAGE_REQUEST_TIMEOUT_MS,
  TRAIN_REQUEST_TIMEOUT_MS,
} from './protocols/stage/constants.ts';
export { chunksOf, HEX64, sha256, type WeightEntry } from './protocols/stage/chunks.ts';
export {
  AUDIT_PARTS,
  AUDIT_REQUESTS,
  type AuditPart,
  type AuditRequest,
  expectTensors,
  type ForwardRequest,
  INFERENCE_REQUESTS,
  LOAD_REQUESTS,
  type LoadRequest,
  SECTION_FORMATS,
  type SectionFormat,
  MAX_SYNC_EVERY,
  parseAdapter,
  parseAssign,
  parseAudit,
  parseChunk,
  parseForward,
  parseGrads,
  parseGradSquares,
  parseLoad,
  parseLoadedAnswer,
  parseManifest,
  parseMicro,
  parseMomentSteps,
  parseName,
  parseNames,
  parseNeedAnswer,
  parsePass,
  parsePassedAnswer,
  parseReduce,
  parseSessionId,
  parseSetMoments,
  parseStageEnvelope,
  parseStep,
  parseSyncedAnswer,
  parseTrainCompute,
  parseTrainReady,
  parseTrainSetup,
  parseWeightEntry,
  type ReduceRequest,
  type WireAdapter,
  jobConfigHash,
  replyToOf,
  type StageEnvelope,
  type StageRequestType,
  type TrainCompute,
  TRAINING_REQUESTS,
  type TrainSetupRequest,
  WIRE_ACTIVATION_CODECS,
  type WireActivationCodec,
} from './protocols/stage/schema.ts';
export {
  type JobPoint,
  type JobProgress,
  type JobView,
  type LedgerSummary,
  type Overview,
  OVERVIEW_LIMITS,
  type OverviewEvent,
  type OverviewEventKind,
  parseJobProgress,
  parseOverview,
} from './protocols/control/overview.ts';
export { PAGE_BYTES, PAGE_ITEMS, pageOf } from './paging.ts';
