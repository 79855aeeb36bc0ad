import { join } from 'node:path';
import { type Address, parseEther, toHex } from 'viem';
import { mnemonicToAccount } from 'viem/accounts';
import {
  ANVIL_MNEMONIC, type Deployment, deployContracts, loadOrCreateAccount, type LocalChain, NodeChain, startAnvil, writeDeployment,
} from '../chain/index.ts';

/** What a local swarm hands each worker and the user: tokens to stake and pay with (the deployer holds the supply). */
export const LOCAL_GRANT = parseEther('1000');

/** A local chain for a local swarm: anvil, the contracts with the swarm's validator as the multisig, funded accounts. */
export interface SwarmChain {
  local: LocalChain;
  deployment: Deployment;
  /** The deployment's file: what `--contracts` takes. */
  file: string;
  /** The user's account on it (anvil's third), with LOCAL_GRANT tokens. */
  user: NodeChain;
  /** Gives an account gas money and LOCAL_GRANT tokens (a user who will pay for jobs from the command line). */
  fund(account: Address): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts anvil, deploys the contracts with the validator's account (kept in `validatorDir`) as
 * the settlement multisig (threshold 1), and gives each node account in `nodeDirs` gas money
 * and LOCAL_GRANT tokens, so that workers can stake as they start.
 */
export async function startSwarmChain(dir: string, validatorDir: string, nodeDirs: string[]): Promise<SwarmChain> {
  const local = await startAnvil();
  try {
    const deployer = mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: 0 });
    const validator = loadOrCreateAccount(validatorDir);
    const contracts = await deployContracts(local.rpc, local.chainId, deployer, {
      supply: 10n ** 27n, validators: [validator.address], threshold: 1, unstakeDelay: 3600, refundAfter: 7 * 86_400,
    });
    const deployment: Deployment = { rpc: local.rpc, chainId: local.chainId, contracts };
    const file = join(dir, 'contracts.json');
    writeDeployment(file, deployment);
    const bank = new NodeChain(deployment, deployer);
    const user = new NodeChain(deployment, mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: 2 }));
    const accounts: Address[] = [validator.address, ...nodeDirs.map((d) => loadOrCreateAccount(d).address)];
    const gas = (a: Address) => bank.clients.publicClient.request({ method: 'anvil_setBalance' as never, params: [a, toHex(parseEther('100'))] as never });
    for (const a of accounts) await gas(a);
    for (const a of [...accounts.slice(1), user.address]) await bank.write('token', 'transfer', [a, LOCAL_GRANT]);
    const fund = async (a: Address) => {
      await gas(a);
      await bank.write('token', 'transfer', [a, LOCAL_GRANT]);
    };
    return { local, deployment, file, user, fund, stop: local.stop };
  } catch (err) {
    await local.stop();
    throw err;
  }
}
