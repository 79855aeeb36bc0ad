// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";

interface IStaking {
    function slash(address account, uint256 amount, bytes32 evidence) external returns (uint256);
}

interface IEscrow {
    function release(bytes32 key, uint256 amount) external;
}

/// @title Settlement by the validators, an m-of-n multisig. Each epoch they post the Merkle root of
/// its rewards (releasing the jobs' escrowed payments into the pool), and each worker claims its
/// reward once with a proof. They slash a stake with the hash of the evidence.
///
/// A multisig action is signed by `threshold` distinct validators, each an EIP-191 signature of
/// the action's digest, which names this chain and this contract; signers come in ascending order
/// of address, so none counts twice.
contract Settlement {
    using SafeERC20 for IERC20;

    IERC20 public immutable token;
    uint256 public immutable threshold;
    address[] public validators;
    mapping(address => bool) public isValidator;
    address private immutable deployer;
    IStaking public staking;
    IEscrow public escrow;

    /// Each settled epoch's reward root, and what it pays in all.
    mapping(uint256 => bytes32) public rewardRoot;
    mapping(uint256 => uint256) public rewardTotal;
    mapping(uint256 => mapping(address => bool)) public claimed;
    /// Rewards posted and not yet claimed: the pool must hold them.
    uint256 public owed;
    /// Slashing actions signed so far: each signature set is good once.
    uint256 public slashNonce;

    event Settled(uint256 indexed epoch, bytes32 root, uint256 total);
    event Claimed(uint256 indexed epoch, address indexed account, uint256 amount);
    event SlashedBy(address indexed account, uint256 amount, bytes32 evidence);

    error BadValidators();
    error AlreadyWired();
    error AlreadySettled(uint256 epoch);
    error NotEnoughSignatures(uint256 valid, uint256 needed);
    error LengthMismatch();
    error PoolShort(uint256 held, uint256 owed);
    error UnknownEpoch(uint256 epoch);
    error AlreadyClaimed(uint256 epoch, address account);
    error BadProof();

    constructor(IERC20 token_, address[] memory validators_, uint256 threshold_) {
        if (threshold_ == 0 || threshold_ > validators_.length) revert BadValidators();
        token = token_;
        threshold = threshold_;
        deployer = msg.sender;
        for (uint256 i = 0; i < validators_.length; i++) {
            if (validators_[i] == address(0) || isValidator[validators_[i]]) revert BadValidators();
            isValidator[validators_[i]] = true;
            validators.push(validators_[i]);
        }
    }

    /// Names the staking and escrow contracts (they name this one): once, by the deployer.
    function wire(IStaking staking_, IEscrow escrow_) external {
        if (msg.sender != deployer || address(staking) != address(0)) revert AlreadyWired();
        staking = staking_;
        escrow = escrow_;
    }

    function validatorCount() external view returns (uint256) {
        return validators.length;
    }

    function settleDigest(uint256 epoch, bytes32 root, uint256 total, bytes32[] calldata jobs, uint256[] calldata amounts)
        public
        view
        returns (bytes32)
    {
        return keccak256(abi.encode("tensorlink.settle", block.chainid, address(this), epoch, root, total, jobs, amounts));
    }

    function slashDigest(address account, uint256 amount, bytes32 evidence, uint256 nonce) public view returns (bytes32) {
        return keccak256(abi.encode("tensorlink.slash", block.chainid, address(this), account, amount, evidence, nonce));
    }

    function _checkSignatures(bytes32 digest, bytes[] calldata signatures) internal view {
        bytes32 signed = MessageHashUtils.toEthSignedMessageHash(digest);
        uint256 valid = 0;
        address last = address(0);
        for (uint256 i = 0; i < signatures.length; i++) {
            (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecover(signed, signatures[i]);
            if (err != ECDSA.RecoverError.NoError || signer <= last || !isValidator[signer]) continue;
            last = signer;
            valid++;
        }
        if (valid < threshold) revert NotEnoughSignatures(valid, threshold);
    }

    /// Closes `epoch`: releases each job's settled payment from escrow into the pool (`jobs`: the
    /// escrows' keys, each a job bound to its user) and posts the root of the epoch's rewards
    /// (leaves: keccak256(keccak256(abi.encode(account, amount)))).
    function settle(
        uint256 epoch,
        bytes32 root,
        uint256 total,
        bytes32[] calldata jobs,
        uint256[] calldata amounts,
        bytes[] calldata signatures
    ) external {
        if (rewardRoot[epoch] != bytes32(0)) revert AlreadySettled(epoch);
        if (jobs.length != amounts.length) revert LengthMismatch();
        _checkSignatures(settleDigest(epoch, root, total, jobs, amounts), signatures);
        for (uint256 i = 0; i < jobs.length; i++) {
            escrow.release(jobs[i], amounts[i]);
        }
        owed += total;
        uint256 held = token.balanceOf(address(this));
        if (held < owed) revert PoolShort(held, owed);
        rewardRoot[epoch] = root;
        rewardTotal[epoch] = total;
        emit Settled(epoch, root, total);
    }

    /// Pays `account` its reward for `epoch`, once; anyone may send the claim, the tokens go to `account`.
    function claim(uint256 epoch, address account, uint256 amount, bytes32[] calldata proof) external {
        bytes32 root = rewardRoot[epoch];
        if (root == bytes32(0)) revert UnknownEpoch(epoch);
        if (claimed[epoch][account]) revert AlreadyClaimed(epoch, account);
        bytes32 leaf = keccak256(bytes.concat(keccak256(abi.encode(account, amount))));
        if (!MerkleProof.verifyCalldata(proof, root, leaf)) revert BadProof();
        claimed[epoch][account] = true;
        owed -= amount;
        token.safeTransfer(account, amount);
        emit Claimed(epoch, account, amount);
    }

    /// Cuts `amount` from `account`'s stake into the pool; `evidence` is the hash of what proves the
    /// cheat (two conflicting signed records, or a record whose re-execution failed).
    function slash(address account, uint256 amount, bytes32 evidence, bytes[] calldata signatures) external {
        _checkSignatures(slashDigest(account, amount, evidence, slashNonce), signatures);
        slashNonce++;
        uint256 cut = staking.slash(account, amount, evidence);
        emit SlashedBy(account, cut, evidence);
    }
}
