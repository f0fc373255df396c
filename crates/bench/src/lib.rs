//! ditto's embedded benchmarks (run in-process, as Silo and Rolis do).
//!
//! - `harness`: worker threads, commit tickets retired as they become durable, latency
//!   histograms, CPU time, progress, reports (printed and JSON).
//! - `tpcc`: TPC-C full mix with the consistency conditions 1-4 and a stock condition.
//! - `ycsb`: YCSB++ as in Rolis 6.1.
//! - `index`: the micro-benchmark that chose the engine's ordered index.

pub mod harness;
pub mod index;
pub mod tpcc;
pub mod ycsb;
