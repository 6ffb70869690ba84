//! xtoken-core's integration tests: one binary (a module per concern), as in every crate of the
//! workspace.

mod losses;
