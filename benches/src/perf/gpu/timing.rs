//! Timing: the events each local rank records between iterations, the warm-ups, and the timed
//! iterations or CUDA-graph replays.

use ringccl::{CollectiveKind, RedOp};

use cudarc::driver::sys::CUevent_flags;

use super::super::coll::Shape;
use super::super::data::PerfElem;
use super::bench::{Bench, Bufs};
use super::{drv, Lib, GRAPH_REPLAYS};

/// Per sample `k < samples`: the slowest local rank's time of it (`ms[rank][k]`, milliseconds
/// between two events), in microseconds per call when a sample holds `per` calls.
pub(super) fn slowest_us(ms: &[Vec<f32>], samples: usize, per: usize) -> Vec<f64> {
    let mut times = vec![0.0f64; samples];
    for rank in ms {
        for (t, &m) in times.iter_mut().zip(rank) {
            *t = t.max(m as f64 * 1000.0 / per.max(1) as f64);
        }
    }
    times
}

impl Bench<'_> {
    /// Makes sure every rank has `k` timing events.
    fn ensure_events(&mut self, k: usize) -> Result<(), String> {
        for (i, &r) in self.local.iter().enumerate() {
            while self.events[i].len() < k {
                let e = drv(
                    "cuEventCreate",
                    self.comm
                        .context(r)
                        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
                )?;
                self.events[i].push(e);
            }
        }
        Ok(())
    }

    fn record_all(&self, k: usize) -> Result<(), String> {
        for (i, &r) in self.local.iter().enumerate() {
            drv(
                "cuEventRecord",
                self.events[i][k].record(self.comm.stream(r)),
            )?;
        }
        Ok(())
    }

    /// Per-sample times (µs, slowest local rank) between boundary events `0..=samples`,
    /// divided by `per`.
    fn read_times(&self, samples: usize, per: usize) -> Result<Vec<f64>, String> {
        self.sync()?;
        let mut ms = Vec::with_capacity(self.events.len());
        for events in &self.events {
            let mut rank = Vec::with_capacity(samples);
            for k in 0..samples {
                rank.push(drv(
                    "cuEventElapsedTime",
                    events[k].elapsed_ms(&events[k + 1]),
                )?);
            }
            ms.push(rank);
        }
        Ok(slowest_us(&ms, samples, per))
    }

    /// Warm-ups, then the timed iterations (or graph replays); returns the per-iteration
    /// times, whether they come from a graph, and (eager only, else NaN) the host's wall time
    /// per iteration of the timed loop: the call and the timing event's record, issued
    /// without waiting on the GPU.
    pub(super) fn time<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<(Vec<f64>, bool, f64), String> {
        let iters = self.opts.iters;
        for _ in 0..self.opts.warmup {
            self.launch(lib, kind, shape, op, inplace, bufs)?;
        }
        if self.opts.graph {
            let captured = self.capture(lib, kind, shape, op, inplace, bufs);
            // One process per GPU: every rank replays graphs, or none does.
            let captured = self.agree(captured);
            if let Some(e) = &self.fatal {
                return Err(e.clone());
            }
            match captured {
                Ok(graphs) => {
                    self.ensure_events(GRAPH_REPLAYS + 1)?;
                    for g in &graphs {
                        drv("cuGraphLaunch", g.launch())?;
                    }
                    for k in 0..GRAPH_REPLAYS {
                        self.record_all(k)?;
                        for g in &graphs {
                            drv("cuGraphLaunch", g.launch())?;
                        }
                    }
                    self.record_all(GRAPH_REPLAYS)?;
                    let times = self.read_times(GRAPH_REPLAYS, iters)?;
                    drop(graphs);
                    return Ok((times, true, f64::NAN));
                }
                Err(e) => {
                    self.note(format!(
                        "CUDA-graph capture failed for {} {} ({e}); timing eager launches instead",
                        lib.name(),
                        kind.name()
                    ));
                    self.sync()?;
                }
            }
        }
        self.ensure_events(iters + 1)?;
        self.record_all(0)?;
        let t0 = std::time::Instant::now();
        for k in 0..iters {
            self.launch(lib, kind, shape, op, inplace, bufs)?;
            self.record_all(k + 1)?;
        }
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
        Ok((self.read_times(iters, 1)?, false, host_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sample_is_the_slowest_ranks_per_call() {
        let ms = vec![vec![1.0f32, 0.5, 2.0], vec![0.5, 1.5, 2.0]];
        assert_eq!(slowest_us(&ms, 3, 1), vec![1000.0, 1500.0, 2000.0]);
        // A graph replay of 100 calls: per call.
        assert_eq!(slowest_us(&ms, 3, 100), vec![10.0, 15.0, 20.0]);
        // `per` 0 counts as 1; no ranks: zeros.
        assert_eq!(slowest_us(&ms[..1], 2, 0), vec![1000.0, 500.0]);
        assert_eq!(slowest_us(&[], 2, 1), vec![0.0, 0.0]);
    }
}
