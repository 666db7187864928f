//! Linux native asynchronous I/O (what libaio wraps) through the raw system calls, for the
//! workloads and tests that keep O_DIRECT requests in flight: io_setup, io_submit,
//! io_getevents, io_destroy. The request layout is libc's `iocb`; the completion record is
//! the kernel's `struct io_event` (linux/aio_abi.h), which libc does not define.
//!
//! Not for: the file system itself (it never submits I/O this way).

use std::io;
use std::os::fd::RawFd;

/// The kernel's `struct io_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoEvent {
    /// The `aio_data` of the request.
    pub data: u64,
    pub obj: u64,
    /// Bytes moved, or a negative errno.
    pub res: i64,
    pub res2: i64,
}

/// linux/aio_abi.h: IOCB_CMD_PREAD, IOCB_CMD_PWRITE.
pub const PREAD: u16 = 0;
pub const PWRITE: u16 = 1;

/// An AIO context (io_setup), destroyed on drop.
pub struct Context(libc::c_ulong);

impl Context {
    /// A context for up to `depth` requests in flight.
    pub fn new(depth: u32) -> io::Result<Context> {
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes the new context's id into `ctx`, which outlives the call.
        let r = unsafe { libc::syscall(libc::SYS_io_setup, depth as libc::c_long, &mut ctx) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Context(ctx))
    }

    /// Submits requests; returns how many the kernel took.
    ///
    /// # Safety
    /// Each request's buffer must stay valid and unmoved until its completion is reaped.
    pub unsafe fn submit(&self, reqs: &mut [libc::iocb]) -> io::Result<usize> {
        let mut ptrs: Vec<*mut libc::iocb> = reqs.iter_mut().map(|r| r as *mut _).collect();
        // SAFETY: `ptrs` points at `reqs`, valid for the call (the kernel copies each request);
        // the caller keeps the buffers valid until the completions are reaped.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                self.0,
                ptrs.len() as libc::c_long,
                ptrs.as_mut_ptr(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Waits for at least `min` completions (at most `max`), retrying on EINTR.
    pub fn reap(&self, min: usize, max: usize) -> io::Result<Vec<IoEvent>> {
        let mut evs = vec![IoEvent::default(); max];
        loop {
            // SAFETY: the kernel writes at most `max` events into `evs`, which holds `max`.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.0,
                    min as libc::c_long,
                    max as libc::c_long,
                    evs.as_mut_ptr(),
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
            if r >= 0 {
                evs.truncate(r as usize);
                return Ok(evs);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is ours and destroyed once (it waits for requests in flight).
        unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
    }
}

/// A request: `op` (PREAD or PWRITE) of `len` bytes at `buf` to or from `fd` at `off`,
/// tagged `data`.
pub fn request(op: u16, fd: RawFd, buf: *mut u8, len: usize, off: u64, data: u64) -> libc::iocb {
    // SAFETY: iocb is plain integers; zero is the value of every field not set here.
    let mut r: libc::iocb = unsafe { std::mem::zeroed() };
    r.aio_data = data;
    r.aio_lio_opcode = op;
    r.aio_fildes = fd as u32;
    r.aio_buf = buf as u64;
    r.aio_nbytes = len as u64;
    r.aio_offset = off as i64;
    r
}

/// A buffer aligned for O_DIRECT (4 KiB), freed on drop.
pub struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned by this value alone, like a Vec's.
unsafe impl Send for Aligned {}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096).unwrap();
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` initialized bytes, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
