// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// @title Collateral: workers and validators lock tokens to take part. Unstaking waits `delay`
/// seconds, and what waits can still be slashed, so a cheat cannot run with its stake.
contract Staking {
    using SafeERC20 for IERC20;

    IERC20 public immutable token;
    /// The validators' multisig: the only one that slashes.
    address public immutable settlement;
    uint256 public immutable delay;

    struct Stake {
        uint256 staked;
        uint256 pending;
        uint256 unlockAt;
    }

    mapping(address => Stake) public stakes;
    /// Evidence already punished: the same evidence slashes once.
    mapping(bytes32 => bool) public evidenceUsed;

    event Staked(address indexed account, uint256 amount);
    event UnstakeRequested(address indexed account, uint256 amount, uint256 unlockAt);
    event Withdrawn(address indexed account, uint256 amount);
    event Slashed(address indexed account, uint256 amount, bytes32 evidence);

    error NotSettlement();
    error Insufficient(uint256 available, uint256 asked);
    error Locked(uint256 unlockAt);
    error EvidenceUsed(bytes32 evidence);

    constructor(IERC20 token_, address settlement_, uint256 delay_) {
        token = token_;
        settlement = settlement_;
        delay = delay_;
    }

    function stakeOf(address account) external view returns (uint256) {
        return stakes[account].staked;
    }

    function stake(uint256 amount) external {
        stakes[msg.sender].staked += amount;
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit Staked(msg.sender, amount);
    }

    /// Moves `amount` out of the stake; it can be withdrawn `delay` seconds after the last request.
    function requestUnstake(uint256 amount) external {
        Stake storage s = stakes[msg.sender];
        if (s.staked < amount) revert Insufficient(s.staked, amount);
        s.staked -= amount;
        s.pending += amount;
        s.unlockAt = block.timestamp + delay;
        emit UnstakeRequested(msg.sender, amount, s.unlockAt);
    }

    function withdraw() external {
        Stake storage s = stakes[msg.sender];
        if (block.timestamp < s.unlockAt) revert Locked(s.unlockAt);
        uint256 amount = s.pending;
        s.pending = 0;
        token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    /// Cuts up to `amount` from the stake, then from what waits to be withdrawn; the cut goes to the
    /// settlement contract's reward pool. Returns what was cut.
    function slash(address account, uint256 amount, bytes32 evidence) external returns (uint256 cut) {
        if (msg.sender != settlement) revert NotSettlement();
        if (evidenceUsed[evidence]) revert EvidenceUsed(evidence);
        evidenceUsed[evidence] = true;
        Stake storage s = stakes[account];
        uint256 fromStake = amount < s.staked ? amount : s.staked;
        s.staked -= fromStake;
        uint256 rest = amount - fromStake;
        uint256 fromPending = rest < s.pending ? rest : s.pending;
        s.pending -= fromPending;
        cut = fromStake + fromPending;
        token.safeTransfer(settlement, cut);
        emit Slashed(account, cut, evidence);
    }
}
