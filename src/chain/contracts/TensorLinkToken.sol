// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title The token work is paid in (TLK): a fixed supply minted once to the deployer.
contract TensorLinkToken is ERC20 {
    constructor(uint256 supply) ERC20("TensorLink", "TLK") {
        _mint(msg.sender, supply);
    }
}
