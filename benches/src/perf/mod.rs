//! `ringccl-perf`: ringccl's collectives next to NCCL's, as nccl-tests measures them.
//!
//! * [`args`]: the command line;
//! * [`coll`]: the collectives measured, buffer shapes and bus-bandwidth factors;
//! * [`data`]: exactly checkable inputs and expected values;
//! * [`report`]: records, the table, JSON and CSV;
//! * [`svg`]: the plot;
//! * [`nccl`]: NCCL through cudarc's raw layer;
//! * [`gpu`]: the measurements;
//! * [`progress`]: the progress bar;
//! * [`procs`]: one process per GPU (the ranks' own exchange).

pub mod args;
pub mod coll;
pub mod data;
pub mod gpu;
pub mod nccl;
pub mod procs;
pub mod progress;
pub mod report;
pub mod svg;
