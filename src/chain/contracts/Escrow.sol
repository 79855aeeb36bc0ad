// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// @title Job escrow: a user deposits payment for a job; the validators' multisig releases it into
/// the reward pool against the work settled for the job. What is never released goes back to the
/// user after `refundAfter` seconds.
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

    mapping(bytes32 => Job) public jobs;

    event Deposited(bytes32 indexed job, address indexed payer, uint256 amount);
    event Released(bytes32 indexed job, uint256 amount);
    event Refunded(bytes32 indexed job, uint256 amount);

    error NotSettlement();
    error NotPayer();
    error Insufficient(uint256 held, uint256 asked);
    error TooEarly(uint256 at);

    constructor(IERC20 token_, address settlement_, uint256 refundAfter_) {
        token = token_;
        settlement = settlement_;
        refundAfter = refundAfter_;
    }

    function deposit(bytes32 job, uint256 amount) external {
        Job storage j = jobs[job];
        if (j.payer == address(0)) j.payer = msg.sender;
        else if (j.payer != msg.sender) revert NotPayer();
        j.amount += amount;
        j.depositedAt = block.timestamp;
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit Deposited(job, msg.sender, amount);
    }

    /// Pays `amount` of a job's deposit into the reward pool: only the multisig, against settled work.
    function release(bytes32 job, uint256 amount) external {
        if (msg.sender != settlement) revert NotSettlement();
        Job storage j = jobs[job];
        if (j.amount < amount) revert Insufficient(j.amount, amount);
        j.amount -= amount;
        token.safeTransfer(settlement, amount);
        emit Released(job, amount);
    }

    function refund(bytes32 job) external {
        Job storage j = jobs[job];
        if (j.payer != msg.sender) revert NotPayer();
        if (block.timestamp < j.depositedAt + refundAfter) revert TooEarly(j.depositedAt + refundAfter);
        uint256 amount = j.amount;
        j.amount = 0;
        token.safeTransfer(msg.sender, amount);
        emit Refunded(job, amount);
    }
}
