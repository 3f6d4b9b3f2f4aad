//! `-G 1`: the timed calls captured into CUDA graphs, one per rank's stream for NCCL (as
//! nccl-tests does) and one forked over every rank's stream for ringccl.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use ringccl::{CollectiveKind, RedOp};

use super::super::coll::Shape;
use super::super::data::PerfElem;
use super::bench::{Bench, Bufs};
use super::{drv, Lib};

impl Bench<'_> {
    /// Captures `-n` calls into CUDA graphs: for NCCL one graph per rank's stream (as
    /// nccl-tests does); for ringccl, whose ranks wait on each other's events, one graph
    /// forked from rank 0's stream to every rank's stream and joined back.
    pub(super) fn capture<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<Vec<CudaGraph>, String> {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let flags = CUgraphInstantiate_flags(0);
        let iters = self.opts.iters;
        let streams: Vec<Arc<CudaStream>> = self.streams().into_iter().cloned().collect();
        match lib {
            Lib::Nccl => {
                let mut begun = 0;
                let body = (|| -> Result<(), String> {
                    for s in &streams {
                        drv("cuStreamBeginCapture", s.begin_capture(mode))?;
                        begun += 1;
                    }
                    for _ in 0..iters {
                        self.launch(lib, kind, shape, op, inplace, bufs)?;
                    }
                    Ok(())
                })();
                let mut graphs = Vec::new();
                let mut first_err = body.err();
                for s in &streams[..begun] {
                    match s.end_capture(flags) {
                        Ok(Some(g)) => graphs.push(g),
                        Ok(None) => {
                            first_err.get_or_insert_with(|| "the capture was empty".into());
                        }
                        Err(e) => {
                            first_err.get_or_insert_with(|| {
                                format!("cuStreamEndCapture failed with {:?}", e.0)
                            });
                        }
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(graphs),
                }
            }
            Lib::Ringccl => {
                let s0 = &streams[0];
                drv("cuStreamBeginCapture", s0.begin_capture(mode))?;
                let mut joins = Vec::new();
                let body = (|| -> Result<(), String> {
                    let ctx0 = self.comm.context(self.local[0]);
                    let fork = drv("cuEventCreate", ctx0.new_event(None))?;
                    drv("cuEventRecord", fork.record(s0))?;
                    for s in &streams[1..] {
                        drv("cuStreamWaitEvent", s.wait(&fork))?;
                    }
                    for _ in 0..iters {
                        self.launch(lib, kind, shape, op, inplace, bufs)?;
                    }
                    for (&r, s) in self.local.iter().zip(&streams).skip(1) {
                        let e = drv("cuEventCreate", self.comm.context(r).new_event(None))?;
                        drv("cuEventRecord", e.record(s))?;
                        drv("cuStreamWaitEvent", s0.wait(&e))?;
                        joins.push(e);
                    }
                    Ok(())
                })();
                let end = s0.end_capture(flags);
                drop(joins);
                body?;
                match end {
                    Ok(Some(g)) => Ok(vec![g]),
                    Ok(None) => Err("the capture was empty".into()),
                    Err(e) => Err(format!("cuStreamEndCapture failed with {:?}", e.0)),
                }
            }
        }
    }
}
