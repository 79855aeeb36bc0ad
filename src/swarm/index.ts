/**
 * Local swarms: a validator and workers on this machine, each a `tensorlink` process of its own, with a local chain
 * (anvil) they settle on. A library user's way to a swarm without a network (`await localSwarm({ workers: 3 })`), and
 * what `tensorlink swarm`, `demo` and `--local N` start.
 */
export { launchNode, type LocalPeer, type LocalSwarm, localSwarm, nodeCommand, type NodeProcess } from './local-swarm.ts';
export { LOCAL_GRANT, type SwarmChain, startSwarmChain } from './local-chain.ts';
