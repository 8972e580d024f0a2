//! Probe links taken out of their programs (`take_link`), so that they
//! are detached together at the recorder's end. A link's release may wait
//! for the tracing grace periods (about 90 ms here). Released on threads of
//! their own, the waits of `uprobe_multi` links (loader/uprobe_multi.rs)
//! overlap: the CUDA probes on one driver library go in about 80 ms. A
//! perf-event uprobe's release waits under the kernel's `event_mutex`, so
//! where those stand in (before 6.6) the threads take turns, 44 links in
//! about 4 s.

/// Threads that release links at once; more links share them.
const MAX_THREADS: usize = 64;

/// See the module docs. Dropping it detaches what it holds.
#[derive(Default)]
pub struct Links(Vec<Box<dyn Send>>);

impl Links {
    /// Keeps `link` attached until [`detach_all`](Links::detach_all).
    pub fn keep(&mut self, link: impl Send + 'static) {
        self.0.push(Box::new(link));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Detaches every link kept, in parallel; returns when all are.
    pub fn detach_all(&mut self) {
        let mut links = std::mem::take(&mut self.0);
        // One or none: released here, as `links` goes.
        if links.len() <= 1 {
            return;
        }
        let per = links.len().div_ceil(MAX_THREADS);
        std::thread::scope(|s| {
            while !links.is_empty() {
                let chunk: Vec<_> = links.drain(..per.min(links.len())).collect();
                // No thread to spare: released here, one after another.
                let _ = std::thread::Builder::new()
                    .name("trainbpf-detach".into())
                    .spawn_scoped(s, move || drop(chunk));
            }
        });
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::{Duration, Instant},
    };

    /// A release that ends only once every other one has begun: only
    /// releases made at once can all end.
    struct Meets {
        begun: Arc<AtomicUsize>,
        met: Arc<AtomicUsize>,
        of: usize,
    }
    impl Drop for Meets {
        fn drop(&mut self) {
            self.begun.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(30);
            while self.begun.load(Ordering::SeqCst) < self.of && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            if self.begun.load(Ordering::SeqCst) == self.of {
                self.met.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn every_link_is_released_at_once_and_before_the_return() {
        let (begun, met) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut links = Links::default();
        for _ in 0..MAX_THREADS {
            links.keep(Meets {
                begun: begun.clone(),
                met: met.clone(),
                of: MAX_THREADS,
            });
        }
        links.detach_all();
        assert!(links.is_empty());
        assert_eq!(met.load(Ordering::SeqCst), MAX_THREADS);
    }

    #[test]
    fn more_links_than_threads_share_them() {
        let done = Arc::new(AtomicUsize::new(0));
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let mut links = Links::default();
        for _ in 0..1000 {
            links.keep(Counted(done.clone()));
        }
        drop(links);
        assert_eq!(done.load(Ordering::SeqCst), 1000);
    }
}
