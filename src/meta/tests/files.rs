//! Tests of file contents as slices (`ops/files.rs`): writes, truncates, fallocate, copies,
//! compaction, slice references, the bytes files store.

use super::*;

engine_tests!(
    write_slices_and_read_chunk,
    truncate_shrink_then_grow_reads_zeros,
    truncate_across_chunks_frees_slices,
    fallocate_modes,
    copy_range_references_source_slices,
    copy_range_across_chunk_boundaries,
    copy_range_same_file_and_errors,
    replace_slices_compaction,
    all_slices_refcounts,
    stored_bytes_count_data_not_holes,
    external_slices_rows_and_references,
);

// ---------------------------------------------------------------------------------------------
// File data
// ---------------------------------------------------------------------------------------------
fn write_slices_and_read_chunk(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        // Fresh slice ids are distinct and never 0.
        let ids: HashSet<u64> = (0..2000).map(|_| m.new_slice_id().unwrap()).collect();
        assert_eq!(ids.len(), 2000);
        assert!(!ids.contains(&0));
        let rec = |pos: u32, id: u64, len: u32| SliceRec {
            pos,
            id,
            size: len,
            off: 0,
            len,
        };
        let (a, b, c) = (
            m.new_slice_id().unwrap(),
            m.new_slice_id().unwrap(),
            m.new_slice_id().unwrap(),
        );
        assert!(!ids.contains(&a) && !ids.contains(&b) && !ids.contains(&c));
        let t = 1_700_000_000_123_456_000;
        let at = m
            .write_slices(
                f.ino,
                &[(0, rec(0, a, 1000)), (0, rec(500, b, 100))],
                Some(t),
            )
            .unwrap();
        assert_eq!(at.length, 1000);
        assert_eq!((at.mtime, at.ctime), (t, t));
        assert_eq!(m.getattr(f.ino).unwrap(), at);
        assert_eq!(
            m.read_chunk(f.ino, 0).unwrap(),
            vec![rec(0, a, 1000), rec(500, b, 100)]
        );
        // A later write appends after the earlier records.
        let at = m
            .write_slices(f.ino, &[(0, rec(200, c, 50))], Some(t + 1))
            .unwrap();
        assert_eq!((at.length, at.mtime), (1000, t + 1), "no shrink");
        assert_eq!(
            m.read_chunk(f.ino, 0).unwrap(),
            vec![rec(0, a, 1000), rec(500, b, 100), rec(200, c, 50)]
        );
        assert_eq!(
            extents(m, f.ino, 0, 1000),
            vec![
                (0, 200, a, 0),
                (200, 50, c, 0),
                (250, 250, a, 250),
                (500, 100, b, 0),
                (600, 400, a, 600)
            ]
        );
        // A write in a later chunk grows the file to there; chunks between are empty.
        let d = m.new_slice_id().unwrap();
        let at = m
            .write_slices(f.ino, &[(2, rec(5, d, 4096))], Some(t + 2))
            .unwrap();
        assert_eq!(at.length, 2 * CHUNK_SIZE + 5 + 4096);
        assert!(m.read_chunk(f.ino, 1).unwrap().is_empty());
        assert_eq!(m.read_chunk(f.ino, 2).unwrap(), vec![rec(5, d, 4096)]);
        assert!(m.read_chunk(f.ino, 3).unwrap().is_empty());
        assert!(m.read_chunk(999_999, 0).unwrap_or_default().is_empty());
        // Refcounts.
        let r = refs(m);
        for id in [a, b, c, d] {
            assert_eq!(r.get(&id), Some(&1), "slice {id}");
        }
        let sizes: HashMap<u64, u32> = m
            .all_slices()
            .unwrap()
            .into_iter()
            .map(|(id, s, _)| (id, s))
            .collect();
        assert_eq!((sizes[&a], sizes[&d]), (1000, 4096));
        // Only files take data.
        let dir = mkdir(m, ROOT_INO, "d");
        assert!(
            m.write_slices(dir.ino, &[(0, rec(0, d, 1))], Some(t))
                .is_err()
        );
        assert_errno(
            m.write_slices(999_999, &[(0, rec(0, d, 1))], Some(t)),
            libc::ENOENT,
        );
    });
}

fn truncate_shrink_then_grow_reads_zeros(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, MIB as u32);
        let t0 = tick();
        let a = m.truncate(&CTX, f.ino, 100).unwrap();
        assert_eq!(a.length, 100);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(extents(m, f.ino, 0, 100), vec![(0, 100, s, 0)]);
        let a = m.truncate(&CTX, f.ino, MIB).unwrap();
        assert_eq!(a.length, MIB);
        assert_eq!(m.getattr(f.ino).unwrap().length, MIB);
        assert_eq!(
            extents(m, f.ino, 0, MIB),
            vec![(0, 100, s, 0), (100, MIB - 100, 0, 0)],
            "bytes cut by truncate must read as zeros after growing"
        );
        // Still referenced by the first 100 bytes.
        assert_eq!(refs(m).get(&s), Some(&1));
        assert!(!dead_ids(m).contains(&s));
        // A write over the zeros shows through.
        let s2 = write(m, f.ino, 4096, 4096);
        assert_eq!(
            extents(m, f.ino, 0, MIB),
            vec![
                (0, 100, s, 0),
                (100, 3996, 0, 0),
                (4096, 4096, s2, 0),
                (8192, MIB - 8192, 0, 0)
            ]
        );
        // Shrink to a point inside the second slice, grow again.
        m.truncate(&CTX, f.ino, 5000).unwrap();
        m.truncate(&CTX, f.ino, 3 * CHUNK_SIZE).unwrap();
        assert_eq!(
            extents(m, f.ino, 0, 3 * CHUNK_SIZE),
            vec![
                (0, 100, s, 0),
                (100, 3996, 0, 0),
                (4096, 904, s2, 0),
                (5000, 3 * CHUNK_SIZE - 5000, 0, 0)
            ]
        );
        // Errors.
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.truncate(&CTX, d.ino, 0), libc::EISDIR);
        let l = m
            .mknod(&CTX, ROOT_INO, b"l", Kind::Symlink, 0o777, 0, Some(b"x"))
            .unwrap();
        assert_errno(m.truncate(&CTX, l.ino, 0), libc::EINVAL);
        assert_errno(m.truncate(&CTX, 999_999, 0), libc::ENOENT);
    });
}

fn truncate_across_chunks_frees_slices(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let a = write(m, f.ino, 0, 4096);
        // One slice across the first chunk boundary (two records).
        let b = write(m, f.ino, CHUNK_SIZE - 4096, 8192);
        let c = write(m, f.ino, 2 * CHUNK_SIZE, 4096);
        let d = write(m, f.ino, 3 * CHUNK_SIZE + 100, 4096);
        assert_eq!(m.getattr(f.ino).unwrap().length, 3 * CHUNK_SIZE + 4196);
        assert_eq!(m.read_chunk(f.ino, 1).unwrap().len(), 1);
        assert_eq!(
            extents(m, f.ino, CHUNK_SIZE - 4096, CHUNK_SIZE + 4096),
            vec![(CHUNK_SIZE - 4096, 8192, b, 0)]
        );
        // Cut inside chunk 1: chunks 2 and 3 go, their slices die.
        let t = m.truncate(&CTX, f.ino, CHUNK_SIZE + 100).unwrap();
        assert_eq!(t.length, CHUNK_SIZE + 100);
        assert!(m.read_chunk(f.ino, 2).unwrap().is_empty());
        assert!(m.read_chunk(f.ino, 3).unwrap().is_empty());
        let dead = dead_ids(m);
        assert!(dead.contains(&c) && dead.contains(&d), "{dead:?}");
        assert!(!dead.contains(&a) && !dead.contains(&b), "{dead:?}");
        let r = refs(m);
        assert!(!r.contains_key(&c) && !r.contains_key(&d));
        assert_eq!(r.get(&b), Some(&2), "b still has both records");
        assert_eq!(
            extents(m, f.ino, CHUNK_SIZE, CHUNK_SIZE + 100),
            vec![(CHUNK_SIZE, 100, b, 4096)]
        );
        assert_eq!(m.usage().unwrap().used_bytes, align4k(CHUNK_SIZE + 100));
        // Cut exactly at the chunk boundary: chunk 1 goes; b lives on in chunk 0.
        m.truncate(&CTX, f.ino, CHUNK_SIZE).unwrap();
        assert!(m.read_chunk(f.ino, 1).unwrap().is_empty());
        assert_eq!(refs(m).get(&b), Some(&1));
        assert!(!dead_ids(m).contains(&b));
        // Grow back: the dropped range reads as zeros.
        m.truncate(&CTX, f.ino, 4 * CHUNK_SIZE).unwrap();
        assert_eq!(
            extents(m, f.ino, 0, 4 * CHUNK_SIZE),
            vec![
                (0, 4096, a, 0),
                (4096, CHUNK_SIZE - 8192, 0, 0),
                (CHUNK_SIZE - 4096, 4096, b, 0),
                (CHUNK_SIZE, 3 * CHUNK_SIZE, 0, 0)
            ]
        );
        // To zero: everything dies.
        let t = m.truncate(&CTX, f.ino, 0).unwrap();
        assert_eq!(t.length, 0);
        for i in 0..4 {
            assert!(m.read_chunk(f.ino, i).unwrap().is_empty(), "chunk {i}");
        }
        let dead = dead_ids(m);
        for id in [a, b, c, d] {
            assert!(dead.contains(&id), "slice {id} not dead: {dead:?}");
        }
        assert!(refs(m).is_empty());
        assert_eq!(m.usage().unwrap().used_bytes, 0);
        assert_eq!(m.usage().unwrap().slices, 0);
    });
}

fn fallocate_modes(e: Engine) {
    each(e, |m| {
        let plain = FallocMode::default();
        let keep = FallocMode {
            keep_size: true,
            ..Default::default()
        };
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..Default::default()
        };
        let zero = FallocMode {
            zero_range: true,
            ..Default::default()
        };
        let zero_keep = FallocMode {
            zero_range: true,
            keep_size: true,
            ..Default::default()
        };
        // Plain: extends, reads zeros, never shrinks.
        let f = mkfile(m, ROOT_INO, "f");
        let a = m.fallocate(&CTX, f.ino, plain, 0, 8192).unwrap();
        assert_eq!(a.length, 8192);
        assert_eq!(m.getattr(f.ino).unwrap().length, 8192);
        assert_eq!(extents(m, f.ino, 0, 8192), vec![(0, 8192, 0, 0)]);
        assert_eq!(
            m.fallocate(&CTX, f.ino, plain, 100, 100).unwrap().length,
            8192
        );
        assert_eq!(
            m.fallocate(&CTX, f.ino, plain, CHUNK_SIZE, 10)
                .unwrap()
                .length,
            CHUNK_SIZE + 10
        );
        // Plain over data keeps the data.
        let g = mkfile(m, ROOT_INO, "g");
        let s = write(m, g.ino, 0, 4096);
        m.fallocate(&CTX, g.ino, plain, 0, 16384).unwrap();
        assert_eq!(
            extents(m, g.ino, 0, 16384),
            vec![(0, 4096, s, 0), (4096, 12288, 0, 0)]
        );
        // keep_size: no growth.
        let k = mkfile(m, ROOT_INO, "k");
        assert_eq!(m.fallocate(&CTX, k.ino, keep, 0, 8192).unwrap().length, 0);
        assert_eq!(m.getattr(k.ino).unwrap().length, 0);
        // Punch a hole: zeros inside, size kept, data around kept.
        let h = mkfile(m, ROOT_INO, "h");
        let s = write(m, h.ino, 0, 16384);
        let t0 = tick();
        let a = m.fallocate(&CTX, h.ino, punch, 4096, 4096).unwrap();
        assert_eq!(a.length, 16384);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(
            extents(m, h.ino, 0, 16384),
            vec![(0, 4096, s, 0), (4096, 4096, 0, 0), (8192, 8192, s, 8192)]
        );
        // Punching past the end does not grow the file.
        let a = m.fallocate(&CTX, h.ino, punch, 16000, 10_000).unwrap();
        assert_eq!(a.length, 16384);
        assert_eq!(
            extents(m, h.ino, 12288, 16384),
            vec![(12288, 3712, s, 12288), (16000, 384, 0, 0)]
        );
        // Zero range: zeros, grows the file.
        let z = mkfile(m, ROOT_INO, "z");
        let s = write(m, z.ino, 0, 8192);
        let a = m.fallocate(&CTX, z.ino, zero, 4096, 8192).unwrap();
        assert_eq!(a.length, 12288);
        assert_eq!(
            extents(m, z.ino, 0, 12288),
            vec![(0, 4096, s, 0), (4096, 8192, 0, 0)]
        );
        // Zero range with keep_size: zeros, no growth.
        let a = m.fallocate(&CTX, z.ino, zero_keep, 0, 100_000).unwrap();
        assert_eq!(a.length, 12288);
        assert_eq!(extents(m, z.ino, 0, 12288), vec![(0, 12288, 0, 0)]);
        // Across a chunk boundary.
        let y = mkfile(m, ROOT_INO, "y");
        let s = write(m, y.ino, CHUNK_SIZE - 4096, 8192);
        m.fallocate(&CTX, y.ino, punch, CHUNK_SIZE - 1000, 2000)
            .unwrap();
        assert_eq!(
            extents(m, y.ino, CHUNK_SIZE - 4096, CHUNK_SIZE + 4096),
            vec![
                (CHUNK_SIZE - 4096, 3096, s, 0),
                (CHUNK_SIZE - 1000, 2000, 0, 0),
                (CHUNK_SIZE + 1000, 3096, s, 5096)
            ]
        );
        assert_eq!(m.getattr(y.ino).unwrap().length, CHUNK_SIZE + 4096);
        // Errors.
        assert_errno(m.fallocate(&CTX, f.ino, plain, 0, 0), libc::EINVAL);
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.fallocate(&CTX, d.ino, plain, 0, 10), libc::EISDIR);
        assert_errno(m.fallocate(&CTX, 999_999, plain, 0, 10), libc::ENOENT);
    });
}

fn copy_range_references_source_slices(e: Engine) {
    each(e, |m| {
        let src = mkfile(m, ROOT_INO, "src");
        let s1 = write(m, src.ino, 0, 4096);
        let s2 = write(m, src.ino, 8192, 4096);
        assert_eq!(m.getattr(src.ino).unwrap().length, 12288);
        // The destination holds data everywhere: the source's hole must become zeros.
        let dst = mkfile(m, ROOT_INO, "dst");
        let dd = write(m, dst.ino, 0, 20_000);
        let t0 = tick();
        let (n, a) = m.copy_range(&CTX, src.ino, 0, dst.ino, 100, 12288).unwrap();
        assert_eq!(n, 12288);
        assert_eq!(a.length, 20_000);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(m.getattr(dst.ino).unwrap(), a);
        assert_eq!(
            extents(m, dst.ino, 0, 20_000),
            vec![
                (0, 100, dd, 0),
                (100, 4096, s1, 0),
                (4196, 4096, 0, 0),
                (8292, 4096, s2, 0),
                (12388, 20_000 - 12388, dd, 12388)
            ]
        );
        // The source is untouched.
        assert_eq!(
            extents(m, src.ino, 0, 12288),
            vec![(0, 4096, s1, 0), (4096, 4096, 0, 0), (8192, 4096, s2, 0)]
        );
        let r = refs(m);
        assert_eq!((r[&s1], r[&s2], r[&dd]), (2, 2, 1));
        // Part of a slice, to a new file.
        let part = mkfile(m, ROOT_INO, "part");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 1000, part.ino, 0, 2000)
            .unwrap();
        assert_eq!((n, a.length), (2000, 2000));
        assert_eq!(extents(m, part.ino, 0, 2000), vec![(0, 2000, s1, 1000)]);
        // Clamped at the source's end.
        let tail = mkfile(m, ROOT_INO, "tail");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 10_000, tail.ino, 0, 1 << 30)
            .unwrap();
        assert_eq!((n, a.length), (2288, 2288));
        assert_eq!(extents(m, tail.ino, 0, 2288), vec![(0, 2288, s2, 1808)]);
        // Nothing to copy at or past the end.
        let (n, a) = m
            .copy_range(&CTX, src.ino, 12288, tail.ino, 0, 100)
            .unwrap();
        assert_eq!((n, a.length), (0, 2288));
        let (n, _) = m
            .copy_range(&CTX, src.ino, 50_000, tail.ino, 0, 100)
            .unwrap();
        assert_eq!(n, 0);
        // A source ending in a hole (fallocate) copied over data: the hole becomes zeros.
        let src2 = mkfile(m, ROOT_INO, "src2");
        let s3 = write(m, src2.ino, 0, 4096);
        m.fallocate(&CTX, src2.ino, FallocMode::default(), 0, 16384)
            .unwrap();
        // ...and a punched hole (a zero record) inside its data.
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..Default::default()
        };
        m.fallocate(&CTX, src2.ino, punch, 1000, 1000).unwrap();
        let dst2 = mkfile(m, ROOT_INO, "dst2");
        let dd2 = write(m, dst2.ino, 0, 20_000);
        let (n, a) = m.copy_range(&CTX, src2.ino, 0, dst2.ino, 0, 16384).unwrap();
        assert_eq!((n, a.length), (16384, 20_000));
        assert_eq!(
            extents(m, dst2.ino, 0, 20_000),
            vec![
                (0, 1000, s3, 0),
                (1000, 1000, 0, 0),
                (2000, 2096, s3, 2000),
                (4096, 12288, 0, 0),
                (16384, 20_000 - 16384, dd2, 16384)
            ]
        );
        // Past the destination's end: a hole before the copy.
        let far = mkfile(m, ROOT_INO, "far");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 0, far.ino, 1 << 20, 4096)
            .unwrap();
        assert_eq!((n, a.length), (4096, (1 << 20) + 4096));
        assert_eq!(
            extents(m, far.ino, 0, (1 << 20) + 4096),
            vec![(0, 1 << 20, 0, 0), (1 << 20, 4096, s1, 0)]
        );
        // Deleting the source keeps the copies' slices alive.
        m.unlink(&CTX, ROOT_INO, b"src").unwrap();
        let dead = dead_ids(m);
        assert!(!dead.contains(&s1) && !dead.contains(&s2), "{dead:?}");
        assert_eq!(
            extents(m, dst.ino, 100, 4196),
            vec![(100, 4096, s1, 0)],
            "copy survives its source"
        );
    });
}

fn copy_range_across_chunk_boundaries(e: Engine) {
    each(e, |m| {
        let src = mkfile(m, ROOT_INO, "src");
        // A 3 MiB slice across the first chunk boundary of the source.
        let s = write(m, src.ino, CHUNK_SIZE - MIB, 3 * MIB as u32);
        let dst = mkfile(m, ROOT_INO, "dst");
        // Source range crosses its boundary 512 KiB in; destination crosses 256 KiB in.
        let (src_off, dst_off, len) = (
            CHUNK_SIZE - 512 * KIB,
            2 * CHUNK_SIZE - 256 * KIB,
            1536 * KIB,
        );
        let (n, a) = m
            .copy_range(&CTX, src.ino, src_off, dst.ino, dst_off, len)
            .unwrap();
        assert_eq!(n, len);
        assert_eq!(a.length, dst_off + len);
        assert_eq!(
            extents(m, dst.ino, 0, dst_off + len),
            vec![(0, dst_off, 0, 0), (dst_off, len, s, 512 * KIB)]
        );
        // Each destination chunk holds only its own part.
        let c1 = slice::build_view(&m.read_chunk(dst.ino, 1).unwrap());
        let c2 = slice::build_view(&m.read_chunk(dst.ino, 2).unwrap());
        assert!(c1.iter().all(|r| r.end() <= CHUNK_SIZE), "{c1:?}");
        assert_eq!(
            c1.iter()
                .filter(|r| r.id == s)
                .map(|r| r.len as u64)
                .sum::<u64>(),
            256 * KIB
        );
        assert_eq!(
            c2.iter()
                .filter(|r| r.id == s)
                .map(|r| r.len as u64)
                .sum::<u64>(),
            len - 256 * KIB
        );
        assert!(m.read_chunk(dst.ino, 0).unwrap().iter().all(|r| r.id == 0));
        // A copy spanning a hole, a chunk boundary and data.
        let h = mkfile(m, ROOT_INO, "h");
        let t = write(m, h.ino, CHUNK_SIZE + 4096, 4096);
        let out = mkfile(m, ROOT_INO, "out");
        let (n, _) = m
            .copy_range(&CTX, h.ino, CHUNK_SIZE - 4096, out.ino, 10, 3 * 4096)
            .unwrap();
        assert_eq!(n, 3 * 4096);
        assert_eq!(
            extents(m, out.ino, 0, 10 + 3 * 4096),
            vec![(0, 8202, 0, 0), (8202, 4096, t, 0)]
        );
    });
}

fn copy_range_same_file_and_errors(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, 8192);
        // Overlapping ranges of one file (after clamping at the end of the source).
        for (so, doff, len) in [
            (0, 0, 100),
            (0, 4096, 8192),
            (4096, 100, 8192),
            (100, 50, 100),
        ] {
            assert_errno(
                m.copy_range(&CTX, f.ino, so, f.ino, doff, len),
                libc::EINVAL,
            );
        }
        assert_eq!(extents(m, f.ino, 0, 8192), vec![(0, 8192, s, 0)]);
        // Disjoint ranges of one file are fine.
        let (n, a) = m.copy_range(&CTX, f.ino, 0, f.ino, 8192, 4096).unwrap();
        assert_eq!((n, a.length), (4096, 12288));
        assert_eq!(
            extents(m, f.ino, 0, 12288),
            vec![(0, 8192, s, 0), (8192, 4096, s, 0)]
        );
        let (n, _) = m.copy_range(&CTX, f.ino, 8192, f.ino, 0, 4096).unwrap();
        assert_eq!(n, 4096);
        assert_eq!(refs(m)[&s], 3);
        // Directories and missing inodes.
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.copy_range(&CTX, d.ino, 0, f.ino, 0, 10), libc::EISDIR);
        assert_errno(m.copy_range(&CTX, f.ino, 0, d.ino, 0, 10), libc::EISDIR);
        assert_errno(m.copy_range(&CTX, 999_999, 0, f.ino, 0, 10), libc::ENOENT);
        assert_errno(m.copy_range(&CTX, f.ino, 0, 999_999, 0, 10), libc::ENOENT);
    });
}

fn replace_slices_compaction(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let a = write(m, f.ino, 0, 1000);
        let b = write(m, f.ino, 1000, 1000);
        let c = write(m, f.ino, 500, 1000);
        let recs = m.read_chunk(f.ino, 0).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a, b, c]);
        let before = extents(m, f.ino, 0, 2000);
        // Compact the first two records into one new slice.
        let n = m.new_slice_id().unwrap();
        let rn = SliceRec {
            pos: 0,
            id: n,
            size: 2000,
            off: 0,
            len: 2000,
        };
        assert!(m.replace_slices(f.ino, 0, &recs[..2], &[rn]).unwrap());
        assert_eq!(m.read_chunk(f.ino, 0).unwrap(), vec![rn, recs[2]]);
        let r = refs(m);
        assert!(!r.contains_key(&a) && !r.contains_key(&b), "{r:?}");
        assert_eq!((r[&n], r[&c]), (1, 1));
        let dead = dead_ids(m);
        assert!(dead.contains(&a) && dead.contains(&b), "{dead:?}");
        assert!(!dead.contains(&n) && !dead.contains(&c));
        assert_eq!(
            extents(m, f.ino, 0, 2000),
            vec![(0, 500, n, 0), (500, 1000, c, 0), (1500, 500, n, 1500)]
        );
        assert_ne!(
            extents(m, f.ino, 0, 2000),
            before,
            "ids changed, layout same"
        );
        // A stale prefix is refused, and nothing changes.
        let x = m.new_slice_id().unwrap();
        let rx = SliceRec { id: x, ..rn };
        assert!(!m.replace_slices(f.ino, 0, &recs[..2], &[rx]).unwrap());
        assert!(
            !m.replace_slices(f.ino, 0, &[rn, recs[2], rn], &[rx])
                .unwrap()
        );
        assert!(!m.replace_slices(f.ino, 0, &[recs[2]], &[rx]).unwrap());
        assert_eq!(m.read_chunk(f.ino, 0).unwrap(), vec![rn, recs[2]]);
        assert!(
            !refs(m).contains_key(&x),
            "a refused replace takes no reference"
        );
        // A record appended meanwhile stays after the replaced prefix.
        let cur = m.read_chunk(f.ino, 0).unwrap();
        let d = write(m, f.ino, 100, 10);
        assert!(m.replace_slices(f.ino, 0, &cur, &[rx]).unwrap());
        let after = m.read_chunk(f.ino, 0).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!((after[0], after[1].id), (rx, d));
        let dead = dead_ids(m);
        assert!(dead.contains(&n) && dead.contains(&c));
        // A slice also referenced elsewhere survives compaction of one file.
        let g = mkfile(m, ROOT_INO, "g");
        let h = mkfile(m, ROOT_INO, "h");
        let s = write(m, g.ino, 0, 4096);
        m.copy_range(&CTX, g.ino, 0, h.ino, 0, 4096).unwrap();
        assert_eq!(refs(m)[&s], 2);
        let y = m.new_slice_id().unwrap();
        let gr = m.read_chunk(g.ino, 0).unwrap();
        let ry = SliceRec { id: y, ..gr[0] };
        assert!(m.replace_slices(g.ino, 0, &gr, &[ry]).unwrap());
        let r = refs(m);
        assert_eq!((r[&s], r[&y]), (1, 1));
        assert!(!dead_ids(m).contains(&s));
        // Replacing a whole chunk with nothing empties it.
        let hr = m.read_chunk(h.ino, 0).unwrap();
        assert!(m.replace_slices(h.ino, 0, &hr, &[]).unwrap());
        assert!(m.read_chunk(h.ino, 0).unwrap().is_empty());
        assert!(dead_ids(m).contains(&s));
        // A slice both in the old and the new records never dies on the way.
        let k = mkfile(m, ROOT_INO, "k");
        let p = write(m, k.ino, 0, 4096);
        let q = write(m, k.ino, 0, 100);
        let kr = m.read_chunk(k.ino, 0).unwrap();
        let trimmed = SliceRec {
            pos: 100,
            off: 100,
            len: 3996,
            ..kr[0]
        };
        assert!(m.replace_slices(k.ino, 0, &kr, &[kr[1], trimmed]).unwrap());
        let r = refs(m);
        assert_eq!((r.get(&p), r.get(&q)), (Some(&1), Some(&1)), "{r:?}");
        let dead = dead_ids(m);
        assert!(!dead.contains(&p) && !dead.contains(&q), "{dead:?}");
        assert_eq!(
            extents(m, k.ino, 0, 4096),
            vec![(0, 100, q, 0), (100, 3996, p, 100)]
        );
    });
}

fn all_slices_refcounts(e: Engine) {
    each(e, |m| {
        assert!(m.all_slices().unwrap().is_empty());
        let f = mkfile(m, ROOT_INO, "f");
        let s = m.new_slice_id().unwrap();
        // One slice referenced by two records.
        let recs = [
            (
                0,
                SliceRec {
                    pos: 0,
                    id: s,
                    size: 300,
                    off: 0,
                    len: 100,
                },
            ),
            (
                0,
                SliceRec {
                    pos: 200,
                    id: s,
                    size: 300,
                    off: 200,
                    len: 100,
                },
            ),
        ];
        m.write_slices(f.ino, &recs, Some(now_nanos())).unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        // Zero records are no slices.
        m.write_slices(f.ino, &[(0, SliceRec::zero(50, 10))], Some(now_nanos()))
            .unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        // A copy adds references.
        let g = mkfile(m, ROOT_INO, "g");
        m.copy_range(&CTX, f.ino, 0, g.ino, 0, 50).unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 3)]);
        let u = m.usage().unwrap();
        assert_eq!((u.slices, u.slice_bytes), (1, 300));
        // Removing files drops them.
        m.unlink(&CTX, ROOT_INO, b"g").unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        assert!(!dead_ids(m).contains(&s));
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert!(m.all_slices().unwrap().is_empty());
        assert_eq!(
            m.dead_slices(10).unwrap(),
            vec![DeadSlice { id: s, size: 300 }]
        );
        let u = m.usage().unwrap();
        assert_eq!((u.slices, u.slice_bytes, u.pending_delete), (0, 0, 1));
        // A reference committed after the slice died (a piece of a pack, committed after the
        // pack's other files went) takes it off the deletion queue.
        let h = mkfile(m, ROOT_INO, "h");
        m.write_slices(h.ino, &recs[1..], Some(now_nanos()))
            .unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 1)]);
        assert!(m.dead_slices(10).unwrap().is_empty());
        m.unlink(&CTX, ROOT_INO, b"h").unwrap();
        assert_eq!(
            m.dead_slices(10).unwrap(),
            vec![DeadSlice { id: s, size: 300 }]
        );
        m.forget_dead_slices(&[s]).unwrap();
        assert!(m.dead_slices(10).unwrap().is_empty());
        assert_eq!(m.usage().unwrap().pending_delete, 0);
    });
}

/// `stored` follows what a file's data covers through every change of its slices.
fn stored_bytes_count_data_not_holes(e: Engine) {
    each(e, |m| {
        let stored = |ino| m.getattr(ino).unwrap().stored;
        let f = mkfile(m, ROOT_INO, "f");
        write(m, f.ino, 0, 10_000);
        assert_eq!(stored(f.ino), 10_000);
        // Far away, across a chunk boundary: the hole between is not stored.
        write(m, f.ino, CHUNK_SIZE - 1000, 3000);
        assert_eq!(stored(f.ino), 13_000);
        assert!(m.getattr(f.ino).unwrap().length > CHUNK_SIZE);
        // Overwriting stored bytes adds only what was a hole.
        write(m, f.ino, 5000, 10_000);
        assert_eq!(stored(f.ino), 18_000);
        // Punching a hole: gone from what is stored.
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..FallocMode::default()
        };
        m.fallocate(&CTX, f.ino, punch, 1000, 2000).unwrap();
        assert_eq!(stored(f.ino), 16_000);
        // Zeroing a range keeps it allocated (as ext4's unwritten extents): its data stays
        // counted, and so does the hole it covers (15,000..16,000).
        let zero = FallocMode {
            zero_range: true,
            ..FallocMode::default()
        };
        m.fallocate(&CTX, f.ino, zero, 14_000, 2000).unwrap();
        assert_eq!(stored(f.ino), 17_000);
        // Preallocation reserves every hole of its range (the punched one too); growth by
        // truncate stores nothing.
        m.fallocate(&CTX, f.ino, FallocMode::default(), 0, 4 * CHUNK_SIZE)
            .unwrap();
        assert_eq!(stored(f.ino), 4 * CHUNK_SIZE);
        m.truncate(&CTX, f.ino, 5 * CHUNK_SIZE).unwrap();
        assert_eq!(stored(f.ino), 4 * CHUNK_SIZE);
        // A copy stores what its source stored in the range, reservations included.
        let g = mkfile(m, ROOT_INO, "g");
        m.copy_range(&CTX, f.ino, 0, g.ino, 0, 20_000).unwrap();
        assert_eq!(stored(g.ino), 20_000);
        // A cut frees what lies past the new end, reservations too.
        m.truncate(&CTX, f.ino, CHUNK_SIZE + 10).unwrap();
        assert_eq!(stored(f.ino), CHUNK_SIZE + 10);
        // Compaction into one slice (here: of 16,000 bytes) keeps holes holes.
        let old = m.read_chunk(f.ino, 0).unwrap();
        let id = m.new_slice_id().unwrap();
        let whole = SliceRec {
            pos: 0,
            id,
            size: 16_000,
            off: 0,
            len: 16_000,
        };
        assert!(m.replace_slices(f.ino, 0, &old, &[whole]).unwrap());
        assert_eq!(stored(f.ino), 16_000 + 10);
        // Cut to less than what is stored.
        m.truncate(&CTX, f.ino, 100).unwrap();
        assert_eq!(stored(f.ino), 100);
        m.truncate(&CTX, f.ino, 0).unwrap();
        assert_eq!(stored(f.ino), 0);
    });
}

/// `attach_external` (unkai import): one external slice per chunk, its rows, the file's
/// length and mtime; refused on a file with bytes; rows dropped with their dead slices.
fn external_slices_rows_and_references(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let size = CHUNK_SIZE + 10;
        let part = |base: u64, len: u64| External {
            id: 0,
            url: "s3://bucket/prefix".into(),
            key: "dir/obj".into(),
            etag: "\"abc\"".into(),
            object_size: size,
            base,
            size: len as u32,
        };
        let parts = [part(0, CHUNK_SIZE), part(CHUNK_SIZE, 10)];
        let a = m.attach_external(f.ino, &parts, 12_345).unwrap();
        assert_eq!((a.length, a.mtime), (size, 12_345));
        let rows = m.externals().unwrap();
        assert_eq!(rows.len(), 2);
        for (i, r) in rows.iter().enumerate() {
            assert!(slice::is_external(r.id));
            assert_eq!(
                *r,
                External {
                    id: r.id,
                    ..parts[i].clone()
                }
            );
            assert_eq!(m.external(r.id).unwrap().as_ref(), Some(r));
            let recs = m.read_chunk(f.ino, i as u32).unwrap();
            assert_eq!(recs.len(), 1);
            assert_eq!((recs[0].id, recs[0].len), (r.id, parts[i].size));
        }
        assert_eq!(m.external(1).unwrap(), None);
        let live: Vec<u64> = m.all_slices().unwrap().iter().map(|s| s.0).collect();
        assert!(rows.iter().all(|r| live.contains(&r.id)));
        // Only an empty file is attached.
        assert_eq!(
            m.attach_external(f.ino, &parts, 1).unwrap_err().errno(),
            libc::EPERM
        );
        // Unlinked: its slices die; forgetting them drops their rows.
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        let ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
        let dead: Vec<u64> = m.all_dead_slices().unwrap().iter().map(|d| d.id).collect();
        assert!(ids.iter().all(|i| dead.contains(i)), "{dead:?}");
        m.forget_dead_slices(&ids).unwrap();
        assert!(m.externals().unwrap().is_empty());
    });
}
