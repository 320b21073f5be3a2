//! Shared by the tree-copy tests (`copy_parity`, `writeback_*`): a fixture with one of
//! every kind of entry, an independent metadata walker, an `rsync -n` comparison and a
//! private mount namespace for tmpfs mounts.
//!
//! The tests need root (ownership, device nodes, `trusted.*` xattrs, mounts). Every
//! tmpfs is mounted inside a private mount namespace owned by one thread, so nothing
//! is ever mounted on the host.

pub use crate::common::{ci, in_private_mount_ns};

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use tempfile::TempDir;

pub const SPARSE_SIZE: u64 = 1 << 30;
pub const BIG_SIZE: usize = 5 * 1024 * 1024;

/// What the fixture holds, counted while building it.
#[derive(Debug, Default)]
pub struct Expected {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub specials: u64,
    pub hardlinks: u64,
    /// Data bytes of fully allocated files (the sparse one is checked separately).
    pub dense_bytes: u64,
}

impl Expected {
    pub fn inodes(&self) -> u64 {
        self.files + self.dirs + self.symlinks + self.specials
    }
}

pub struct Builder<'a> {
    pub root: &'a Path,
    pub expected: Expected,
}

impl Builder<'_> {
    pub fn path(&self, rel: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(rel))
    }

    pub fn dir(&mut self, rel: &[u8], mode: u32) {
        let path = self.path(rel);
        fs::create_dir(&path).expect("mkdir");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod dir");
        self.expected.dirs += 1;
    }

    pub fn file(&mut self, rel: &[u8], data: &[u8], mode: u32) {
        let path = self.path(rel);
        fs::write(&path, data).expect("write file");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod file");
        self.expected.files += 1;
        self.expected.dense_bytes += data.len() as u64;
    }

    pub fn symlink(&mut self, rel: &[u8], target: &[u8]) {
        std::os::unix::fs::symlink(OsStr::from_bytes(target), self.path(rel)).expect("symlink");
        self.expected.symlinks += 1;
    }

    pub fn hard_link(&mut self, existing: &[u8], rel: &[u8]) {
        // Linux links a symlink itself rather than its target.
        fs::hard_link(self.path(existing), self.path(rel)).expect("hard link");
        self.expected.hardlinks += 1;
    }

    pub fn node(&mut self, rel: &[u8], kind: SFlag, dev: u64) {
        mknod(&self.path(rel), kind, Mode::from_bits_truncate(0o640), dev).expect("mknod");
        self.expected.specials += 1;
    }

    /// chown clears setuid/setgid, so the mode is set again afterwards.
    pub fn own(&self, rel: &[u8], uid: u32, gid: u32) {
        let path = self.path(rel);
        let mode = fs::symlink_metadata(&path).expect("stat").mode();
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).expect("chown");
        if mode & libc::S_IFMT != libc::S_IFLNK {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).expect("chmod");
        }
    }

    pub fn xattr(&self, rel: &[u8], name: &str, value: &[u8]) {
        xattr::set(self.path(rel), name, value).expect("set xattr");
    }
}

/// Pseudo-random bytes, so that a copy misplacing a block is noticed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// POSIX ACL in the kernel's xattr encoding: owner rw-, user 1234 r-x, group r--,
/// mask r-x, other ---.
pub fn acl_xattr() -> Vec<u8> {
    acl_granting(1234, 5)
}

/// An access ACL (as `system.posix_acl_access` holds it) granting the user `uid`
/// the permissions `perm` (rwx bits), with a mask that lets them through.
pub fn acl_granting(uid: u32, perm: u16) -> Vec<u8> {
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, perm, uid),
        (0x04, 4, u32::MAX),
        (0x10, perm, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    acl
}

/// Builds one of every kind of entry under `root` and gives every entry its own
/// nanosecond times.
pub fn build_fixture(root: &Path) -> Expected {
    let mut b = Builder {
        root,
        expected: Expected::default(),
    };
    b.file(b"plain.txt", b"plain text\n", 0o644);
    b.file(b"empty", b"", 0o600);
    b.file(b"big.bin", &noise(BIG_SIZE, 7), 0o640);
    b.file(b"owned.txt", b"not root's", 0o640);
    b.own(b"owned.txt", 1234, 2345);

    let sparse = File::create(b.path(b"sparse.img")).expect("create sparse");
    sparse.write_all_at(&noise(4096, 1), 0).expect("write");
    sparse
        .write_all_at(&noise(4096, 2), SPARSE_SIZE / 2)
        .expect("write");
    sparse
        .write_all_at(&noise(1024, 3), SPARSE_SIZE - 1024)
        .expect("write");
    sparse.set_len(SPARSE_SIZE).expect("extend");
    b.expected.files += 1;

    b.dir(b"private", 0o700);
    b.file(b"private/secret", b"s3cret", 0o600);
    b.dir(b"readonly", 0o755);
    b.dir(b"readonly/sub", 0o755);
    b.file(b"readonly/inner.txt", b"inner", 0o444);
    b.file(b"readonly/sub/f", b"f", 0o644);
    fs::set_permissions(b.path(b"readonly/sub"), fs::Permissions::from_mode(0o555)).expect("chmod");
    b.dir(b"shared", 0o2775);
    b.own(b"shared", 1234, 2345);
    b.file(b"shared/doc", b"group doc", 0o664);
    b.dir(b"sticky", 0o1777);
    b.file(b"sticky/note", b"note", 0o666);

    b.dir(b"bin", 0o755);
    b.file(b"bin/suid", b"#!/bin/true\n", 0o4755);
    b.own(b"bin/suid", 1234, 2345);
    b.file(b"bin/sgid", b"#!/bin/true\n", 0o2711);

    b.dir(b"links", 0o755);
    b.symlink(b"links/rel", b"../plain.txt");
    b.symlink(b"links/abs", b"/etc/hostname");
    b.symlink(b"links/dangling", b"no/such/target");
    b.symlink(b"links/todir", b"../private");
    b.symlink(b"links/owned", b"plain.txt");
    b.own(b"links/owned", 1234, 2345);
    b.symlink(b"links/nonutf8", b"\xff target \xfe");

    b.dir(b"hard", 0o755);
    b.file(b"hard/a", b"pair", 0o644);
    b.hard_link(b"hard/a", b"hard/b");
    b.file(b"hard/t1", b"triple", 0o600);
    b.symlink(b"hard/symlink", b"../plain.txt");
    b.hard_link(b"hard/symlink", b"hard/symlink-link");

    b.dir(b"special", 0o755);
    nix::unistd::mkfifo(&b.path(b"special/fifo"), Mode::from_bits_truncate(0o620)).expect("mkfifo");
    b.expected.specials += 1;
    drop(std::os::unix::net::UnixListener::bind(b.path(b"special/socket")).expect("bind socket"));
    b.expected.specials += 1;
    b.node(b"special/null", SFlag::S_IFCHR, makedev(1, 3));
    b.node(b"special/blk", SFlag::S_IFBLK, makedev(7, 200));

    b.dir(b"names", 0o755);
    b.file(b"names/\xff\xfe", b"bytes", 0o644);
    b.file(b"names/with space", b"space", 0o644);
    b.file(b"names/new\nline", b"newline", 0o644);
    b.dir(b"names/\xfe dir", 0o750);
    b.file(b"names/\xfe dir/\xff", b"nested bytes", 0o644);

    b.dir(b"xattr", 0o755);
    b.file(b"xattr/file", b"with attributes", 0o644);
    b.xattr(b"xattr/file", "user.mime_type", b"text/plain");
    b.xattr(b"xattr/file", "user.binary", &[0, 1, 2, 255]);
    b.xattr(b"xattr/file", "trusted.tmpfsctl", b"trusted value");
    b.dir(b"xattr/dir", 0o755);
    b.xattr(b"xattr/dir", "user.dir", b"directory attribute");
    // user.* is not allowed on symlinks; trusted.* is.
    b.symlink(b"xattr/link", b"file");
    b.xattr(b"xattr/link", "trusted.link", b"on the link itself");

    b.dir(b"acl", 0o755);
    b.file(b"acl/file", b"acl", 0o640);
    b.xattr(b"acl/file", "system.posix_acl_access", &acl_xattr());
    b.dir(b"acl/dir", 0o755);
    b.xattr(b"acl/dir", "system.posix_acl_default", &acl_xattr());
    b.file(b"acl/dir/child", b"inherits the default ACL", 0o644);

    b.dir(b"deep", 0o755);
    let mut deep = b"deep".to_vec();
    for level in 0..40 {
        deep.extend_from_slice(format!("/d{level:02}").as_bytes());
        b.dir(&deep, 0o755);
    }
    deep.extend_from_slice(b"/leaf.txt");
    b.file(&deep, b"leaf", 0o644);
    b.hard_link(b"hard/t1", b"deep/d00/t2");
    b.hard_link(b"hard/t1", b"readonly/t3");
    fs::set_permissions(b.path(b"readonly"), fs::Permissions::from_mode(0o555)).expect("chmod");

    set_distinct_times(root);
    b.expected
}

/// Gives every entry (and the root) its own atime and mtime with nanoseconds. The
/// atime lies in the future, after both the mtime and the ctime (which is now), so
/// relatime never updates it when a directory is listed or a symlink is read, and the
/// atimes of source and copy stay comparable.
pub fn set_distinct_times(root: &Path) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let mut paths = vec![root.to_path_buf()];
    let mut i = 0;
    while i < paths.len() {
        if fs::symlink_metadata(&paths[i]).expect("stat").is_dir() {
            let mut children: Vec<_> = fs::read_dir(&paths[i])
                .expect("read_dir")
                .map(|e| e.expect("entry").path())
                .collect();
            children.sort();
            paths.extend(children);
        }
        i += 1;
    }
    for (i, path) in paths.iter().enumerate() {
        let i = i as i64;
        let atime = TimeSpec::new(now + 86_400 + i, (i * 7_919_011 + 13) % 1_000_000_000);
        let mtime = TimeSpec::new(1_500_000_000 + i * 1000, (i * 104_729_003 + 1) % 1_000_000_000);
        utimensat(
            nix::fcntl::AT_FDCWD,
            path,
            &atime,
            &mtime,
            UtimensatFlags::NoFollowSymlink,
        )
        .expect("set times");
    }
}

/// Moves the atime of every entry below `root` (not the root) into the future, keeping
/// mtimes: relatime then never updates it when the copy reads a symlink or a file, so
/// source and copy atimes stay comparable.
pub fn set_future_atimes(root: &Path) {
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("type").is_dir() {
                pending.push(entry.path());
            }
            set_future_atime(&entry.path());
        }
    }
}

/// [`set_future_atimes`] for one entry.
pub fn set_future_atime(path: &Path) {
    let future = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
        + 86_400;
    utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &TimeSpec::new(future, 0),
        &TimeSpec::UTIME_OMIT,
        UtimensatFlags::NoFollowSymlink,
    )
    .expect("set atime");
}

/// Everything `cp -a`/`rsync -aHAX` promise to keep, for one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub kind: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Not for directories, whose size depends on the filesystem.
    pub size: Option<u64>,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub target: Option<Vec<u8>>,
    pub rdev: Option<u64>,
    pub nlink: Option<u64>,
    /// Smallest path among the names of a multiply-linked inode.
    pub link_group: Option<Vec<u8>>,
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
    pub blocks: u64,
}

pub type Tree = BTreeMap<Vec<u8>, Meta>;

pub fn snapshot(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut inodes: HashMap<(u64, u64), Vec<Vec<u8>>> = HashMap::new();
    let mut pending = vec![Vec::new()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(root.join(OsStr::from_bytes(&dir))).expect("read_dir") {
            let name = entry.expect("entry").file_name();
            let mut rel = dir.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            let path = root.join(OsStr::from_bytes(&rel));
            let md = fs::symlink_metadata(&path).expect("lstat");
            let kind = md.mode() & libc::S_IFMT;
            let is_dir = kind == libc::S_IFDIR;
            if is_dir {
                pending.push(rel.clone());
            } else if md.nlink() > 1 {
                inodes.entry((md.dev(), md.ino())).or_default().push(rel.clone());
            }
            let xattrs = xattr::list(&path)
                .expect("list xattrs")
                .map(|name| {
                    let value = xattr::get(&path, &name).expect("get xattr").unwrap_or_default();
                    (name, value)
                })
                .collect();
            let device = md.file_type().is_char_device() || md.file_type().is_block_device();
            let meta = Meta {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                size: (!is_dir).then_some(md.size()),
                atime: (md.atime(), md.atime_nsec()),
                mtime: (md.mtime(), md.mtime_nsec()),
                target: md.file_type().is_symlink().then(|| {
                    fs::read_link(&path)
                        .expect("readlink")
                        .into_os_string()
                        .into_vec()
                }),
                rdev: device.then_some(md.rdev()),
                nlink: (!is_dir).then_some(md.nlink()),
                link_group: None,
                xattrs,
                blocks: md.blocks(),
            };
            tree.insert(rel, meta);
        }
    }
    for names in inodes.values() {
        let first = names.iter().min().expect("groups are not empty");
        for name in names {
            tree.get_mut(name).expect("walked").link_group = Some(first.clone());
        }
    }
    tree
}

/// Compares everything but allocation (which differs between filesystems and is
/// checked for the sparse file only), listing each difference.
pub fn assert_same_tree(src: &Tree, dst: &Tree) {
    let mut problems = Vec::new();
    for (rel, want) in src {
        let shown = String::from_utf8_lossy(rel);
        match dst.get(rel) {
            None => problems.push(format!("missing {shown:?}")),
            Some(got) => {
                let want = Meta {
                    blocks: 0,
                    ..want.clone()
                };
                let got = Meta {
                    blocks: 0,
                    ..got.clone()
                };
                if want != got {
                    problems.push(format!("{shown:?}:\n  source {want:?}\n  copy   {got:?}"));
                }
            }
        }
    }
    for rel in dst.keys().filter(|rel| !src.contains_key(*rel)) {
        problems.push(format!("unexpected {:?}", String::from_utf8_lossy(rel)));
    }
    assert!(
        problems.is_empty(),
        "copy differs from source:\n{}",
        problems.join("\n")
    );
}

pub fn assert_same_contents(src: &Path, dst: &Path, tree: &Tree) {
    let open = |path: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(path)
            .expect("open for comparison")
    };
    let (mut a, mut b) = (vec![0; 1 << 20], vec![0; 1 << 20]);
    for (rel, meta) in tree.iter().filter(|(_, m)| m.kind == libc::S_IFREG) {
        let rel = OsStr::from_bytes(rel);
        let (mut fa, mut fb) = (open(&src.join(rel)), open(&dst.join(rel)));
        let mut offset = 0;
        loop {
            let n = fa.read(&mut a).expect("read source");
            fb.read_exact(&mut b[..n]).expect("read copy");
            assert!(a[..n] == b[..n], "{rel:?} differs near offset {offset}");
            if n == 0 {
                break;
            }
            offset += n as u64;
        }
        assert_eq!(fb.read(&mut b).expect("read copy"), 0, "{rel:?} is longer");
        assert_eq!(offset, meta.size.expect("files have a size"));
    }
}

/// What a caller does for the tmpfs root, which `copy_tree` leaves alone.
pub fn copy_root_metadata(src: &Path, dst: &Path) {
    let md = fs::metadata(src).expect("stat source root");
    std::os::unix::fs::chown(dst, Some(md.uid()), Some(md.gid())).expect("chown root");
    fs::set_permissions(dst, fs::Permissions::from_mode(md.mode() & 0o7777)).expect("chmod root");
    let atime = TimeSpec::new(md.atime(), md.atime_nsec());
    let mtime = TimeSpec::new(md.mtime(), md.mtime_nsec());
    utimensat(
        nix::fcntl::AT_FDCWD,
        dst,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .expect("utimens root");
}

/// `rsync -aHAXn -i --delete` itemizes every entry whose type, contents' quick check
/// (size and mtime), permissions, owner, group, symlink target, device number,
/// hard-link grouping, ACLs or xattrs differ, and every entry only `dst` has. It does
/// not compare atimes (only with `--atimes`), which the walker does. `None` when rsync
/// is not installed (a failure under CI).
pub fn rsync_differences(src: &Path, dst: &Path) -> Option<String> {
    let out = match Command::new("rsync")
        .args(["-aHAXn", "--itemize-changes", "--delete", "--no-implied-dirs"])
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dst.display()))
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            ci::missing("rsync, for the rsync comparison", "apt-get install rsync");
            return None;
        }
        Err(e) => panic!("cannot run rsync: {e}"),
    };
    assert!(
        out.status.success(),
        "rsync failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The full parity check between a fixture and its copy.
pub fn assert_parity(src: &Path, dst: &Path) {
    let (src_tree, dst_tree) = assert_in_sync(src, dst);
    assert!(src_tree.len() > 90, "fixture walked: {} entries", src_tree.len());

    let (src_sparse, dst_sparse) = (&src_tree[&b"sparse.img"[..]], &dst_tree[&b"sparse.img"[..]]);
    assert!(
        src_sparse.blocks * 512 < 1 << 20,
        "the fixture itself must be sparse"
    );
    assert!(
        dst_sparse.blocks <= src_sparse.blocks + 128,
        "copy allocates {} blocks, source {}",
        dst_sparse.blocks,
        src_sparse.blocks
    );
}

/// Gives `dst`'s root the metadata of `src`'s (which the copies leave to the caller),
/// then checks that the walker, a byte-by-byte comparison and rsync all see the same
/// trees. Returns both snapshots.
pub fn assert_in_sync(src: &Path, dst: &Path) -> (Tree, Tree) {
    copy_root_metadata(src, dst);
    let (src_tree, dst_tree) = (snapshot(src), snapshot(dst));
    assert_same_tree(&src_tree, &dst_tree);
    assert_same_contents(src, dst, &src_tree);
    if let Some(diff) = rsync_differences(src, dst) {
        assert_eq!(diff, "", "rsync sees differences");
    }
    (src_tree, dst_tree)
}

/// Inode number and file type of every entry below `root`, by relative path (the
/// type too, as a filesystem may give a freed inode number to the next new entry).
pub fn inodes(root: &Path) -> BTreeMap<Vec<u8>, (u64, u32)> {
    let mut found = BTreeMap::new();
    let mut pending = vec![Vec::new()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(root.join(OsStr::from_bytes(&dir))).expect("read_dir") {
            let entry = entry.expect("entry");
            let mut rel = dir.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(entry.file_name().as_bytes());
            let md = entry.metadata().expect("lstat");
            if md.is_dir() {
                pending.push(rel.clone());
            }
            found.insert(rel, (md.ino(), md.mode() & libc::S_IFMT));
        }
    }
    found
}

pub fn fixture() -> (TempDir, Expected) {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let expected = build_fixture(dir.path());
    (dir, expected)
}

/// Unmounts on drop, so a failing assertion does not leave the temporary directory
/// busy.
pub struct Tmpfs<'a>(&'a Path);

pub fn mount_tmpfs<'a>(on: &'a Path, options: &str) -> Tmpfs<'a> {
    mount(Some("tmpfs"), on, Some("tmpfs"), MsFlags::empty(), Some(options)).expect("mount tmpfs");
    Tmpfs(on)
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        if let Err(e) = umount2(self.0, MntFlags::MNT_DETACH) {
            eprintln!("cannot unmount {}: {e}", self.0.display());
        }
    }
}

/// The baseline of a disk directory that did not change since the last write-back:
/// every entry of `dst` as it is now. Merged against it, `sync_tree` makes `dst`
/// equal to `src`, as a mirror would.
pub fn unchanged_disk(dst: &Path) -> tmpfsctl::copy::Baseline {
    use tmpfsctl::copy::baseline::{Mark, Sig};
    let mut b = tmpfsctl::copy::Baseline::none();
    let dev = fs::symlink_metadata(dst).expect("stat dst").dev();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in fs::read_dir(dst.join(&rel)).expect("list dst") {
            let e = e.expect("dir entry");
            let rel = rel.join(e.file_name());
            let m = fs::symlink_metadata(dst.join(&rel)).expect("stat");
            b.marks.insert(
                rel.as_os_str().as_bytes(),
                Mark::Entry(Sig {
                    ino: m.ino(),
                    mode: m.mode(),
                    size: m.size() as i64,
                    mtime: (m.mtime(), m.mtime_nsec()),
                    ctime: (m.ctime(), m.ctime_nsec()),
                }),
            );
            if m.is_dir() && m.dev() == dev {
                todo.push(rel);
            }
        }
    }
    b
}

/// `sync_tree` against [`unchanged_disk`]: `dst` ends up equal to `src`.
pub fn mirror(
    src: &Path,
    dst: &Path,
    progress: Option<&mut dyn FnMut(&tmpfsctl::copy::SyncStats)>,
) -> Result<tmpfsctl::copy::SyncStats, tmpfsctl::copy::CopyError> {
    let base = unchanged_disk(dst);
    tmpfsctl::copy::sync_tree(
        src,
        dst,
        tmpfsctl::copy::Merge {
            base: &base,
            journal: None,
            deletions: None,
            dirty: None,
            barriers: None,
            copied: None,
            touched: None,
        },
        progress,
    )
    .map(|s| s.stats)
}

/// What a tree holds: per path, the type and the contents (a directory's are empty).
pub fn contents(root: &Path) -> BTreeMap<PathBuf, (bool, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in fs::read_dir(root.join(&rel)).expect("list") {
            let rel = rel.join(e.expect("entry").file_name());
            let m = fs::symlink_metadata(root.join(&rel)).expect("stat");
            let data = if m.is_dir() {
                todo.push(rel.clone());
                Vec::new()
            } else {
                fs::read(root.join(&rel)).expect("read")
            };
            out.insert(rel, (m.is_dir(), data, m.permissions().mode() & 0o7777));
        }
    }
    out
}

/// xorshift: the same seed makes the same sequence of changes, so two copies can be
/// given the same ones.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Lets the coarse clock move on, so the sides' changes are ordered by their ctimes
/// as they were made.
pub fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(12));
}

/// Runs `test` with a 16 MiB tmpfs (the RAM side) and a directory under /tmp (the
/// disk side), in a private mount namespace.
pub fn with_trees(test: impl FnOnce(&Path, &Path) + Send) {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    let disk = tempfile::tempdir_in("/tmp").expect("tempdir");
    crate::common::in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=16m,mode=0755");
        test(ram.path(), disk.path());
    });
}

/// One write-back pass against `base`, without a journal, a tracker or a deletion
/// watch.
pub fn plain_pass(
    src: &Path,
    dst: &Path,
    base: &tmpfsctl::copy::Baseline,
) -> Result<tmpfsctl::copy::Synced, tmpfsctl::copy::CopyError> {
    let merge = tmpfsctl::copy::Merge {
        base,
        journal: None,
        deletions: None,
        dirty: None,
        barriers: None,
        copied: None,
        touched: None,
    };
    tmpfsctl::copy::sync_tree(src, dst, merge, None)
}
