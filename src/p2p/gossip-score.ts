/**
 * Gossipsub's peer scores, set for TensorLink's one topic. A message its receiver's topic validator rejects (malformed,
 * or past its publisher's rate) counts against the peer that sent it, squared: a peer past GRAYLIST_AFTER_REJECTS of them
 * is graylisted, and its messages are dropped as they arrive, before their signatures are checked (the costly part of a
 * flood). The count decays by a tenth a second, so a peer that stops is heard again within half a minute.
 */
import { PEERS_TOPIC } from './protocols/control/constants.ts';

/** gossipsub's default: a peer scored below it is graylisted. */
export const GRAYLIST_THRESHOLD = -80;
/** Rejected messages after which a peer's score falls below GRAYLIST_THRESHOLD. */
export const GRAYLIST_AFTER_REJECTS = 9;

export function gossipScore() {
  return {
    scoreParams: {
      topics: {
        [PEERS_TOPIC]: {
          topicWeight: 1,
          // no reward for time in the mesh or first deliveries: a flooder must not earn credit to spend on rejects
          timeInMeshWeight: 0, timeInMeshQuantum: 1_000, timeInMeshCap: 1,
          firstMessageDeliveriesWeight: 0, firstMessageDeliveriesDecay: 0.5, firstMessageDeliveriesCap: 1,
          // announcements come every 2 s from each worker, none from most peers: no penalty for delivering few
          meshMessageDeliveriesWeight: 0, meshMessageDeliveriesDecay: 0.5, meshMessageDeliveriesCap: 1, meshMessageDeliveriesThreshold: 1,
          meshMessageDeliveriesWindow: 10, meshMessageDeliveriesActivation: 5_000,
          meshFailurePenaltyWeight: 0, meshFailurePenaltyDecay: 0.5,
          invalidMessageDeliveriesWeight: -1, invalidMessageDeliveriesDecay: 0.9,
        },
      },
      // many honest peers share one address (a home behind NAT, a swarm on one machine, a gateway's users): gossipsub's
      // penalty past 10 peers an address would graylist them all; floods are bounded per publisher instead
      IPColocationFactorWeight: 0,
      // gossipsub's own penalty for broken promises (an IWANT unanswered, a GRAFT in backoff), -10 × count²: three would
      // graylist a peer, and a graylisted peer is hung up on; a tenth of it leaves room for a peer restarting under churn
      behaviourPenaltyWeight: -1,
    },
  };
}
