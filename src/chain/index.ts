export { ACCOUNT_FILE, loadOrCreateAccount } from './account.ts';
export { ANVIL_MNEMONIC, anvilBinary, type LocalChain, startAnvil } from './anvil.ts';
export { ARTIFACTS_FILE, type Artifact, CONTRACTS_DIR } from './compile.ts';
export { type Deployment, parseDeployment, readDeployment, writeDeployment } from './contracts-file.ts';
export { artifacts, type ChainClients, clients, type Contracts, deployContracts, deployed, type DeployOptions } from './deploy.ts';
export { RewardTree, rewardLeaf } from './reward-tree.ts';
export {
  escrowKey, type EscrowHeld, jobKey, MIN_STAKE, NodeChain, PRICE_PER_FLOP, type SettledEpoch, SLASH_BPS, userKey,
} from './node-chain.ts';
