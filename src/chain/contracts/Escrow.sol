// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// @title Job escrow: a user deposits payment for a job; the validators' multisig releases it into
/// the reward pool against the work settled for the job. What is never released goes back to the
/// payer after `refundAfter` seconds.
///
/// An escrow is bound to the user who runs the job: its key is `keyOf(job, user)`, where `user` is
/// the keccak256 of the user's peer id. The validators pay a record from it only when that user
/// accepted the record (an Ed25519 signature by the peer id's key, checked off chain), so records
/// handed in by anyone else are never paid from it.
contract Escrow {
    using SafeERC20 for IERC20;

    IERC20 public immutable token;
    address public immutable settlement;
    uint256 public immutable refundAfter;

    struct Job {
        address payer;
        uint256 amount;
        uint256 depositedAt;
    }

    /// Escrows by key (`keyOf(job, user)`).
    mapping(bytes32 => Job) public jobs;

    event Deposited(bytes32 indexed key, address indexed payer, bytes32 job, bytes32 user, uint256 amount);
    event Released(bytes32 indexed key, uint256 amount);
    event Refunded(bytes32 indexed key, uint256 amount);

    error NotSettlement();
    error NotPayer();
    error Insufficient(uint256 held, uint256 asked);
    error TooEarly(uint256 at);

    constructor(IERC20 token_, address settlement_, uint256 refundAfter_) {
        token = token_;
        settlement = settlement_;
        refundAfter = refundAfter_;
    }

    /// The key of the escrow of `job` (keccak256 of its id) run by `user` (keccak256 of its peer id).
    function keyOf(bytes32 job, bytes32 user) public pure returns (bytes32) {
        return keccak256(abi.encode(job, user));
    }

    /// Pays `amount` into the escrow of `job` as run by `user`; the first depositor is its payer,
    /// and only the payer may add to it (and take back what was never released).
    function deposit(bytes32 job, bytes32 user, uint256 amount) external {
        bytes32 key = keyOf(job, user);
        Job storage j = jobs[key];
        if (j.payer == address(0)) j.payer = msg.sender;
        else if (j.payer != msg.sender) revert NotPayer();
        j.amount += amount;
        j.depositedAt = block.timestamp;
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit Deposited(key, msg.sender, job, user, amount);
    }

    /// Pays `amount` of an escrow into the reward pool: only the multisig, against settled work.
    function release(bytes32 key, uint256 amount) external {
        if (msg.sender != settlement) revert NotSettlement();
        Job storage j = jobs[key];
        if (j.amount < amount) revert Insufficient(j.amount, amount);
        j.amount -= amount;
        token.safeTransfer(settlement, amount);
        emit Released(key, amount);
    }

    /// Gives the payer back what was never released, `refundAfter` seconds after its last deposit.
    function refund(bytes32 key) external {
        Job storage j = jobs[key];
        if (j.payer != msg.sender) revert NotPayer();
        if (block.timestamp < j.depositedAt + refundAfter) revert TooEarly(j.depositedAt + refundAfter);
        uint256 amount = j.amount;
        j.amount = 0;
        token.safeTransfer(msg.sender, amount);
        emit Refunded(key, amount);
    }
}
