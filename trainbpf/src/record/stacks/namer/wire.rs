//! The namer's messages on its socket: a length, then the bytes, with
//! descriptors riding on the first byte (`SCM_RIGHTS`).

use std::{
    io::{Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::net::UnixStream,
    },
    time::Instant,
};

use super::{MAX_FDS, MAX_MESSAGE};

/// Writes one message: its length, then its bytes, the descriptors
/// riding on the first byte.
pub fn send(s: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let len = (bytes.len() as u64).to_le_bytes();
    let iov = [std::io::IoSlice::new(&len)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(s.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != len.len() {
        (&*s).write_all(&len[n..])?;
    }
    (&*s).write_all(bytes)
}

/// Before each read, the time left to `deadline` as the socket's timeout:
/// a peer that sends a byte at a time cannot stretch a message past it.
fn wait_at_most(s: &UnixStream, deadline: Option<Instant>) -> std::io::Result<()> {
    let Some(d) = deadline else {
        return Ok(());
    };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    s.set_read_timeout(Some(left))
}

/// Fills `buf`, within the deadline.
fn read_full(s: &UnixStream, buf: &mut [u8], deadline: Option<Instant>) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        wait_at_most(s, deadline)?;
        match (&*s).read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one message and the descriptors that came with it, all of it
/// before `deadline` where there is one. Descriptors cut short (more than
/// the bound, or none left to this process) fail the message.
pub fn recv(s: &UnixStream, deadline: Option<Instant>) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut len = [0u8; 8];
    let mut fds = Vec::new();
    let got;
    {
        wait_at_most(s, deadline)?;
        let mut iov = [std::io::IoSliceMut::new(&mut len)];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: descriptors the kernel just installed in this
                // process for this message: owned here and nowhere else.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(std::io::Error::other(
                "the message's descriptors were cut short",
            ));
        }
        got = msg.bytes;
    }
    if got == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    read_full(s, &mut len[got..], deadline)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_MESSAGE {
        return Err(std::io::Error::other(format!(
            "a message of {n} bytes, over the bound"
        )));
    }
    let mut bytes = vec![0u8; n as usize];
    read_full(s, &mut bytes, deadline)?;
    Ok((bytes, fds))
}
