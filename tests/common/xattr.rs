//! Extended attributes through libc (std has no API for them): one wrapper a system call, with
//! the buffer size the caller chooses (0 asks for the size), and two that read a whole value or
//! list exactly (a size query, then a read of that size).

use super::cpath;
use std::collections::BTreeSet;
use std::ffi::CString;
use std::io;
use std::path::Path;

fn name_c(name: &str) -> CString {
    CString::new(name).unwrap()
}

/// A return value of libc as an io::Result (negative: errno).
fn cvt(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A buffer of `size` bytes and the pointer handed to the kernel (null for a size query).
fn buffer(size: usize) -> (Vec<u8>, *mut libc::c_void) {
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    (buf, ptr)
}

type SetFn = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *const libc::c_void,
    libc::size_t,
    libc::c_int,
) -> libc::c_int;
type GetFn = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *mut libc::c_void,
    libc::size_t,
) -> libc::ssize_t;
type ListFn =
    unsafe extern "C" fn(*const libc::c_char, *mut libc::c_char, libc::size_t) -> libc::ssize_t;

fn set_with(call: SetFn, p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (cp, cn) = (cpath(p), name_c(name));
    let r = unsafe {
        call(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    cvt(r as isize).map(|_| ())
}

fn get_with(call: GetFn, p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let (cp, cn) = (cpath(p), name_c(name));
    let (mut buf, ptr) = buffer(size);
    let n = cvt(unsafe { call(cp.as_ptr(), cn.as_ptr(), ptr, size) })?;
    buf.truncate(n.min(size));
    Ok((n, buf))
}

fn list_with(call: ListFn, p: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let cp = cpath(p);
    let (mut buf, ptr) = buffer(size);
    let n = cvt(unsafe { call(cp.as_ptr(), ptr.cast(), size) })?;
    buf.truncate(n.min(size));
    Ok((n, buf))
}

/// setxattr(2): follows a final symlink.
pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    set_with(libc::setxattr, p, name, value, flags)
}

/// lsetxattr(2): acts on a symlink itself.
pub fn lsetxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    set_with(libc::lsetxattr, p, name, value, flags)
}

/// getxattr(2) with a buffer of `size` bytes (0: asks for the size); returns what the call
/// returned (the value's length, or its size with `size` 0) and the bytes read.
pub fn getxattr_sized(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    get_with(libc::getxattr, p, name, size)
}

/// lgetxattr(2), as `getxattr_sized`.
pub fn lgetxattr_sized(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    get_with(libc::lgetxattr, p, name, size)
}

/// listxattr(2) with a buffer of `size` bytes (0: asks for the size); returns what the call
/// returned and the bytes read (names, each ended by a NUL).
pub fn listxattr_sized(p: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    list_with(libc::listxattr, p, size)
}

/// llistxattr(2), as `listxattr_sized`.
pub fn llistxattr_sized(p: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    list_with(libc::llistxattr, p, size)
}

/// removexattr(2).
pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let (cp, cn) = (cpath(p), name_c(name));
    cvt(unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) } as isize).map(|_| ())
}

/// A whole value: a size query, then a read of exactly that size (which must agree).
pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (n, _) = getxattr_sized(p, name, 0)?;
    let (m, v) = getxattr_sized(p, name, n.max(1))?;
    assert_eq!(m, n, "size query and read disagree for {name}");
    Ok(v)
}

/// All names: a size query, then a list of exactly that size (which must agree). Every name
/// must be UTF-8.
pub fn listxattr(p: &Path) -> io::Result<BTreeSet<String>> {
    let (n, _) = listxattr_sized(p, 0)?;
    let (m, buf) = listxattr_sized(p, n.max(1))?;
    assert_eq!(m, n, "size query and list disagree");
    Ok(split_names(&buf)
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect())
}

/// The names in a list that listxattr returned (NUL-ended; empty ones skipped).
pub fn split_names(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    buf.split(|&b| b == 0).filter(|s| !s.is_empty())
}

/// The `user.` names in such a list (as text, invalid UTF-8 replaced).
pub fn user_names(buf: &[u8]) -> impl Iterator<Item = String> + '_ {
    split_names(buf)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .filter(|s| s.starts_with("user."))
}
