//! A lib target so kdrop can name this crate as a build-dependency (cargo
//! rebuilds kdrop when it changes); the programs live in the `kdrop` binary.
#![no_std]
