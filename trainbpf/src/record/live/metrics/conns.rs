//! The `/metrics` server's open connections: since when each is open and
//! whether it has sent its request yet. A full server makes room by
//! closing the connection that has waited longest without asking anything,
//! rather than refusing the newcomer: otherwise one client holding every
//! slot open, idle, and reopening each as it times out, blinds every
//! scraper.
//!
//! A connection carries one request (the server turns keep-alive off), so
//! it is idle from its accept until its request head is read, then busy
//! until it closes. A busy connection is never closed to make room: it is
//! a scrape under way, bounded by the server's deadline for a whole
//! connection.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::sync::Notify;

/// One open connection.
#[derive(Debug)]
struct Conn {
    id: u64,
    opened: Instant,
    /// Its request head has been read.
    busy: bool,
    /// Told when the connection is to close to make room.
    close: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    conns: Vec<Conn>,
}

/// The open connections, at most `max` of them.
#[derive(Debug)]
pub struct Conns {
    max: usize,
    open: Mutex<Open>,
}

/// A connection let in: its id, and what tells its task to close it.
#[derive(Debug)]
pub struct Admitted {
    pub id: u64,
    pub close: Arc<Notify>,
}

impl Conns {
    pub fn new(max: usize) -> Conns {
        Conns {
            max,
            open: Mutex::new(Open::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // A panic elsewhere leaves the list itself whole.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets in a connection accepted at `now`. When every slot is taken,
    /// the connection idle the longest is told to close and its slot given
    /// to this one; `None` (refuse it) only when every open connection is
    /// busy with a request.
    pub fn admit(&self, now: Instant) -> Option<Admitted> {
        let mut open = self.lock();
        if open.conns.len() >= self.max {
            let oldest = oldest_idle(&open.conns)?;
            let evicted = open.conns.swap_remove(oldest);
            evicted.close.notify_one();
        }
        let id = open.next_id;
        open.next_id += 1;
        let close = Arc::new(Notify::new());
        open.conns.push(Conn {
            id,
            opened: now,
            busy: false,
            close: close.clone(),
        });
        Some(Admitted { id, close })
    }

    /// Connection `id` has sent its request head: it is no longer one to
    /// close to make room.
    pub fn busy(&self, id: u64) {
        if let Some(c) = self.lock().conns.iter_mut().find(|c| c.id == id) {
            c.busy = true;
        }
    }

    /// Connection `id` has closed (or was closed to make room: then it is
    /// gone already).
    pub fn closed(&self, id: u64) {
        self.lock().conns.retain(|c| c.id != id);
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().conns.len()
    }
}

/// The index of the idle connection opened first.
fn oldest_idle(conns: &[Conn]) -> Option<usize> {
    conns
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.busy)
        .min_by_key(|(_, c)| (c.opened, c.id))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// A notify with a stored permit: its connection was told to close.
    fn told(n: &Notify) -> bool {
        let f = n.notified();
        tokio::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.as_mut().poll(&mut cx).is_ready()
    }

    use std::future::Future as _;

    #[test]
    fn a_full_server_closes_its_oldest_idle_connection_for_a_new_one() {
        let t0 = Instant::now();
        let conns = Conns::new(3);
        let a = conns.admit(at(t0, 0)).unwrap();
        let b = conns.admit(at(t0, 10)).unwrap();
        let c = conns.admit(at(t0, 20)).unwrap();
        assert_eq!(conns.len(), 3);
        let d = conns.admit(at(t0, 30)).unwrap();
        assert_eq!(conns.len(), 3, "one closed for one let in");
        assert!(told(&a.close), "the oldest idle one is closed");
        assert!(!told(&b.close) && !told(&c.close) && !told(&d.close));
        // Its task's own end, later, changes nothing.
        conns.closed(a.id);
        assert_eq!(conns.len(), 3);
    }

    #[test]
    fn a_connection_that_has_asked_is_never_closed_to_make_room() {
        let t0 = Instant::now();
        let conns = Conns::new(2);
        let a = conns.admit(at(t0, 0)).unwrap();
        let b = conns.admit(at(t0, 10)).unwrap();
        conns.busy(a.id);
        let c = conns.admit(at(t0, 20)).unwrap();
        assert!(!told(&a.close), "a scrape under way is kept");
        assert!(told(&b.close), "the idle one makes room");
        conns.busy(c.id);
        assert!(
            conns.admit(at(t0, 30)).is_none(),
            "every slot busy: the newcomer is refused"
        );
        conns.closed(a.id);
        assert!(conns.admit(at(t0, 40)).is_some(), "a slot freed by a close");
    }

    #[test]
    fn the_oldest_is_by_accept_time_then_by_order() {
        let t0 = Instant::now();
        let conns = Conns::new(2);
        let a = conns.admit(at(t0, 5)).unwrap();
        let b = conns.admit(at(t0, 5)).unwrap();
        conns.admit(at(t0, 6)).unwrap();
        assert!(told(&a.close) && !told(&b.close));
    }
}
