//! gpudoc's own small helper processes ([`super::drain`], [`super::keeper`]): gpudoc executed afresh, in a
//! session of its own (no terminal's keys or hang-up, not the job's process group), with a clean signal
//! mask, ignoring the terminal's and a broken pipe's signals, and holding no descriptor of gpudoc's but the
//! ones it is given (a device node NVML opened without `O_CLOEXEC` does not go along).

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Where the given descriptors are put in the helper: the first at fd 3, the next at 4, ...
pub const FIRST_FD: RawFd = 3;
/// Where they are gathered first, above anything gpudoc has open, so that moving one never closes another.
const PARK_FD: RawFd = 1000;

/// Names the helper process (`ps`, `pkill`): executed as /proc/self/exe, it would be called `exe`.
pub fn set_name(name: &str) {
    if let Ok(name) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME copies at most 16 bytes from our string.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    }
}

/// Starts `gpudoc ARGS...` as `name` with `fds` at [`FIRST_FD`] on, its standard fds on /dev/null (gpudoc's
/// own stay as they are until the descriptors are moved: one is often fd 1 or 2). Not waited for.
pub fn spawn(name: &str, args: &[String], fds: Vec<RawFd>) -> io::Result<()> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(name).args(args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_IGN);
            }
            for (i, &fd) in fds.iter().enumerate() {
                if libc::dup2(fd, PARK_FD + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            for std_fd in 0..3 {
                libc::dup2(null, std_fd);
            }
            for i in 0..fds.len() as RawFd {
                libc::dup2(PARK_FD + i, FIRST_FD + i);
            }
            let keep = FIRST_FD + fds.len() as RawFd;
            if libc::syscall(libc::SYS_close_range, keep, libc::c_uint::MAX, 0) != 0 {
                for fd in keep..PARK_FD + fds.len() as RawFd {
                    libc::close(fd);
                }
            }
            Ok(())
        });
    }
    cmd.spawn().map(|_| ())
}
