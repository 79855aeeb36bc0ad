// Chrome lets a tab create about 500 RTCPeerConnections in its whole life, closed ones included. libp2p reuses a
// connection per peer, and a failed WebRTC attempt is not retried for 10 minutes (src/p2p/webrtc.ts), but a tab that
// lends for days could still reach the limit, where Chrome fails every new one at once. The tab counts what it
// creates and stops at RTC_BUDGET, before Chrome's limit: from then on it reaches peers through the validator's relay
// (its WebSockets when WebRTC-direct is refused too), and the page says so.
export const RTC_BUDGET = 450;

let created = 0;

/** RTCPeerConnections this tab has created. */
export function peerConnectionsCreated(): number {
  return created;
}

const Native = globalThis.RTCPeerConnection;
if (typeof Native === 'function') {
  globalThis.RTCPeerConnection = class extends Native {
    constructor(config?: RTCConfiguration) {
      if (created >= RTC_BUDGET) {
        throw new Error(`this tab has created ${created} WebRTC connections (Chrome allows about 500 in a tab's life): reload it to open more`);
      }
      super(config);
      created++;
    }
  } as typeof RTCPeerConnection;
}
