//! xtoken-train's integration tests: one binary, so that the training stack links once; a module
//! per concern. `ddp` and `multinode` need the `collective` feature; the others run on the CPU
//! backends, and spawn the `xtoken` binary where a command is tested.

mod cli;
mod configs;
mod ddp;
mod demo;
mod families;
mod fixture;
mod floor_plan;
mod hardening;
mod harness;
mod memory;
mod models_cli;
mod multinode;
mod on_policy;
mod precision;
mod profile;
mod run_directory;
mod served;
mod stored;
mod streaming;
#[path = "../../../tests/it/support/mod.rs"]
mod support;
#[path = "../../../tests/it/support/tokenizer_json.rs"]
mod tokenizer_json;
mod train;
mod vllm;
