//! `mount.tmpfsctl`, the mount(8) helper behind fstab mode's lines of type
//! `tmpfsctl`. mount(8) runs it as `/sbin/mount.tmpfsctl SOURCE TARGET
//! [-sfnv] [-N NS] [-o OPTIONS]` before anything covers TARGET, so it can
//! read the disk directory's owner and mode at boot and give them to the
//! tmpfs root: a `chown` of the disk directory needs no new `boot install`.
//! Parsing and the options it builds are pure; `main` stats and mounts.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use nix::mount::MsFlags;

use crate::mount::RootAttrs;

/// The name mount(8) looks for (`/sbin/mount.<type>`); the binary acts as
/// the helper when started under it.
pub const NAME: &str = "mount.tmpfsctl";

/// mount(8)'s exit statuses, which helpers share (mount(8), "RETURN CODES").
const EX_USAGE: i32 = 1;
const EX_FAIL: i32 = 32;

/// One invocation, as mount(8) passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub source: String,
    pub target: PathBuf,
    /// `-s`: drop options tmpfs does not know instead of failing on them.
    pub sloppy: bool,
    /// `-f`: do everything but the mount.
    pub fake: bool,
    pub verbose: bool,
    /// `-N`: the mount namespace to mount in (a PID or a path).
    pub namespace: Option<String>,
    pub options: Vec<String>,
}

/// What to ask the kernel for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub flags: MsFlags,
    pub data: String,
    pub remount: bool,
    /// Options dropped by `-s`, for the verbose line.
    pub dropped: Vec<String>,
}

/// Parses mount(8)'s helper command line (without argv[0]).
pub fn parse(args: &[String]) -> Result<Request, String> {
    let mut positional = Vec::new();
    let mut req = Request {
        source: String::new(),
        target: PathBuf::new(),
        sloppy: false,
        fake: false,
        verbose: false,
        namespace: None,
        options: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => {
                let v = it.next().ok_or("option `-o` needs a value")?;
                req.options.extend(split_options(v)?);
            }
            "-N" => req.namespace = Some(it.next().ok_or("option `-N` needs a value")?.clone()),
            // mount(8) passes the type only when it has a subtype; ours has none.
            "-t" => {
                it.next().ok_or("option `-t` needs a value")?;
            }
            flags if flags.starts_with('-') && flags.len() > 1 => {
                for c in flags[1..].chars() {
                    match c {
                        's' => req.sloppy = true,
                        'f' => req.fake = true,
                        'v' => req.verbose = true,
                        // No mtab to leave alone: the kernel's mount table is the only one.
                        'n' => {}
                        _ => {
                            return Err(format!(
                                "unknown option `-{c}`; valid: -s, -f, -n, -v, -N NS, -o OPTIONS"
                            ))
                        }
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    match <[String; 2]>::try_from(positional) {
        Ok([source, target]) => {
            req.source = source;
            req.target = PathBuf::from(target);
            Ok(req)
        }
        Err(p) => Err(format!(
            "expected SOURCE and TARGET, got {} argument{}",
            p.len(),
            if p.len() == 1 { "" } else { "s" }
        )),
    }
}

/// Comma-separated options; a double-quoted value may hold commas (libmount's rule).
fn split_options(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if quoted {
        return Err(format!("unbalanced quote in options `{s}`"));
    }
    out.push(cur);
    out.retain(|o| !o.is_empty());
    Ok(out)
}

/// Filesystem-independent options as MS_* flags: (flag, whether it is set).
fn vfs_flag(name: &str) -> Option<(MsFlags, bool)> {
    Some(match name {
        "ro" => (MsFlags::MS_RDONLY, true),
        "rw" => (MsFlags::MS_RDONLY, false),
        "nosuid" => (MsFlags::MS_NOSUID, true),
        "suid" => (MsFlags::MS_NOSUID, false),
        "nodev" => (MsFlags::MS_NODEV, true),
        "dev" => (MsFlags::MS_NODEV, false),
        "noexec" => (MsFlags::MS_NOEXEC, true),
        "exec" => (MsFlags::MS_NOEXEC, false),
        "sync" => (MsFlags::MS_SYNCHRONOUS, true),
        "async" => (MsFlags::MS_SYNCHRONOUS, false),
        "dirsync" => (MsFlags::MS_DIRSYNC, true),
        "noatime" => (MsFlags::MS_NOATIME, true),
        "atime" => (MsFlags::MS_NOATIME, false),
        "nodiratime" => (MsFlags::MS_NODIRATIME, true),
        "diratime" => (MsFlags::MS_NODIRATIME, false),
        "relatime" => (MsFlags::MS_RELATIME, true),
        "norelatime" => (MsFlags::MS_RELATIME, false),
        "strictatime" => (MsFlags::MS_STRICTATIME, true),
        "nostrictatime" => (MsFlags::MS_STRICTATIME, false),
        "lazytime" => (MsFlags::MS_LAZYTIME, true),
        "nolazytime" => (MsFlags::MS_LAZYTIME, false),
        "silent" => (MsFlags::MS_SILENT, true),
        "loud" => (MsFlags::MS_SILENT, false),
        _ => return None,
    })
}

/// Options for mount(8) alone, which it normally strips before calling a
/// helper; dropped if they get through (an older mount, a hand-run helper).
fn userspace_only(o: &str) -> bool {
    let key = o.split('=').next().unwrap_or(o);
    o.starts_with("x-")
        || o.starts_with("X-")
        || matches!(
            key,
            "defaults"
                | "auto"
                | "noauto"
                | "user"
                | "nouser"
                | "users"
                | "owner"
                | "group"
                | "nofail"
                | "_netdev"
                | "comment"
                | "loop"
                | "helper"
                | "user_xattr"
        )
}

/// The options tmpfs itself takes (Documentation/filesystems/tmpfs.rst).
fn tmpfs_option(o: &str) -> bool {
    let key = o.split('=').next().unwrap_or(o);
    matches!(
        key,
        "size"
            | "nr_blocks"
            | "nr_inodes"
            | "mode"
            | "uid"
            | "gid"
            | "huge"
            | "mpol"
            | "inode32"
            | "inode64"
            | "noswap"
            | "quota"
            | "usrquota"
            | "grpquota"
            | "usrquota_block_hardlimit"
            | "usrquota_inode_hardlimit"
            | "grpquota_block_hardlimit"
            | "grpquota_inode_hardlimit"
            | "casefold"
            | "strict_encoding"
    )
}

/// The kernel call for `req`. `target` is TARGET's owner and mode before
/// the mount covers it; they fill in `uid=`, `gid=` and `mode=` where the
/// line does not set them (a remount leaves the root as it is).
pub fn call(req: &Request, target: Option<RootAttrs>) -> Result<Call, String> {
    let mut flags = MsFlags::empty();
    let mut data: Vec<String> = Vec::new();
    let mut dropped = Vec::new();
    let mut remount = false;
    for o in &req.options {
        if o == "remount" {
            remount = true;
        } else if matches!(
            o.as_str(),
            "bind" | "rbind" | "move" | "make-private" | "make-shared"
        ) {
            return Err(format!(
                "`{o}` is not a tmpfs mount; mount.tmpfsctl only mounts tmpfs"
            ));
        } else if let Some((f, set)) = vfs_flag(o) {
            flags.set(f, set);
        } else if userspace_only(o) {
        } else if tmpfs_option(o) || !req.sloppy {
            data.push(o.clone());
        } else {
            dropped.push(o.clone());
        }
    }
    if !remount {
        let root = target.ok_or("the owner and mode of the mount point are needed")?;
        let has = |k: &str| data.iter().any(|o| o.split('=').next() == Some(k));
        let mut fill = Vec::new();
        if !has("mode") {
            fill.push(format!("mode={:o}", root.mode));
        }
        if !has("uid") {
            fill.push(format!("uid={}", root.uid));
        }
        if !has("gid") {
            fill.push(format!("gid={}", root.gid));
        }
        data.extend(fill);
    }
    Ok(Call {
        flags,
        data: data.join(","),
        remount,
        dropped,
    })
}

/// Entry point when started as `mount.tmpfsctl`; returns mount(8)'s status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args: Vec<String> = match args
        .into_iter()
        .map(|a| String::from_utf8(a.into_vec()))
        .collect()
    {
        Ok(a) => a,
        Err(_) => return fail(EX_USAGE, "arguments are not UTF-8"),
    };
    let req = match parse(&args) {
        Ok(r) => r,
        Err(why) => {
            let code = fail(EX_USAGE, &why);
            crate::out::eprint(&format!(
                "usage: {NAME} SOURCE TARGET [-sfnv] [-N NS] [-o OPTIONS]\n"
            ));
            return code;
        }
    };
    if let Some(ns) = &req.namespace {
        if let Err(e) = crate::mount::enter_namespace(ns) {
            return fail(EX_FAIL, &format!("{e:#}"));
        }
    }
    let fstab = std::fs::read_to_string(FSTAB).ok();
    if let Err(why) = check_target(&req, fstab.as_deref()) {
        return fail(EX_FAIL, &why);
    }
    let pinned = match crate::mount::PinnedDir::open(&req.target) {
        Ok(p) => p,
        Err(e) => return fail(EX_FAIL, &format!("{e:#}")),
    };
    // Before the mount covers it: the disk directory's owner and mode.
    let target = if req.options.iter().any(|o| o == "remount") {
        None
    } else {
        match RootAttrs::of_followed(&pinned.proc_path()) {
            Ok(a) => Some(a),
            Err(e) => return fail(EX_FAIL, &format!("{e:#}")),
        }
    };
    let c = match call(&req, target) {
        Ok(c) => c,
        Err(why) => return fail(EX_USAGE, &why),
    };
    if req.verbose {
        let dropped = if c.dropped.is_empty() {
            String::new()
        } else {
            format!(" (dropped: {})", c.dropped.join(","))
        };
        eprintln!(
            "{NAME}: {} {} on {} with {}{dropped}",
            if c.remount { "remounting" } else { "mounting tmpfs" },
            crate::out::escape(&req.source),
            crate::out::escape(&req.target),
            crate::out::escape(&c.data)
        );
    }
    if req.fake {
        return 0;
    }
    let done = if c.remount {
        crate::mount::remount(&pinned.proc_path(), c.flags, &c.data)
            .map_err(|e| anyhow::anyhow!("mount -o remount,{} {}: {e}", c.data, req.target.display()))
    } else {
        crate::mount::mount_fs(
            &req.source,
            &pinned.proc_path(),
            crate::backend::tmpfs::FSTYPE,
            c.flags,
            &c.data,
        )
    };
    match done {
        Ok(()) => 0,
        Err(e) => fail(EX_FAIL, &format!("{e:#}")),
    }
}

/// Where mount(8) reads the lines it runs this helper for (with `-T`, elsewhere:
/// then no line is found here, and only the path it passes is checked).
const FSTAB: &str = "/etc/fstab";

/// mount(8) passes the target with every symlink on the way resolved (util-linux
/// before 2.39 cannot be told not to). A user owning a directory above the managed
/// path could put a symlink to /etc there before a boot, and the tmpfs covered
/// /etc. So the target must be the path the fstab line of this source names; the
/// directory is then opened without following symlinks (where mount(8) passes the
/// path as written, `X-mount.nocanonicalize`, that refuses the symlink itself).
pub fn check_target(req: &Request, fstab: Option<&str>) -> Result<(), String> {
    let Some(written) = fstab.and_then(|f| fstab_target(f, &req.source)) else {
        return Ok(());
    };
    if written == req.target {
        return Ok(());
    }
    Err(format!(
        "the fstab line of {} names {}, but mount(8) passed {}: a symlink on the way was followed; nothing was mounted (remove the symlink, or fix the line with `tmpfsctl boot install`)",
        req.source,
        written.display(),
        req.target.display()
    ))
}

/// The target of the first line of type `tmpfsctl` with `source` in `fstab`.
pub fn fstab_target(fstab: &str, source: &str) -> Option<PathBuf> {
    fstab.lines().find_map(|line| {
        let mut fields = line.split_whitespace().map(unescape);
        let (src, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (!line.trim_start().starts_with('#')
            && src == source.as_bytes()
            && fstype == super::fstab::FSTYPE.as_bytes())
        .then(|| PathBuf::from(OsString::from_vec(target)))
    })
}

/// An fstab field with its octal escapes (`\040`) decoded.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

fn fail(code: i32, why: &str) -> i32 {
    crate::out::eprint(&format!("{NAME}: {}\n", crate::out::escape(why)));
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fstab_line_of_the_source_names_the_target() {
        let fstab = "# tmpfsctl-a /commented tmpfsctl size=1M 0 0\n\
            tmpfsctl-a /other tmpfs size=1M 0 0\n\
            tmpfsctl-b /srv/b tmpfsctl size=1M 0 0\n\
            \ttmpfsctl-a   /srv/var\\040cache/caf\\303\\251\\134x  tmpfsctl size=1M 0 0\n";
        assert_eq!(
            fstab_target(fstab, "tmpfsctl-a"),
            Some(PathBuf::from("/srv/var cache/café\\x"))
        );
        assert_eq!(fstab_target(fstab, "tmpfsctl-b"), Some(PathBuf::from("/srv/b")));
        assert_eq!(fstab_target(fstab, "tmpfsctl-c"), None);
        assert_eq!(unescape("a\\04"), b"a\\04", "a short escape stays");
        assert_eq!(unescape("\\08x"), b"\\08x", "not octal");
    }

    #[test]
    fn a_target_other_than_the_lines_is_refused() {
        let req = |t: &str| parse(&args(&format!("tmpfsctl-b {t}"))).unwrap();
        let fstab = Some("tmpfsctl-b /srv/b tmpfsctl size=1M 0 0\n");
        assert_eq!(check_target(&req("/srv/b"), fstab), Ok(()));
        let why = check_target(&req("/etc"), fstab).unwrap_err();
        assert!(why.contains("names /srv/b, but mount(8) passed /etc"), "{why}");
        assert_eq!(
            check_target(&req("/etc"), None),
            Ok(()),
            "no fstab (mount -T elsewhere)"
        );
        assert_eq!(
            check_target(&req("/etc"), Some("")),
            Ok(()),
            "no line of this source"
        );
    }

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    const DISK: RootAttrs = RootAttrs {
        uid: 33,
        gid: 34,
        mode: 0o750,
    };

    #[test]
    fn parses_what_mount_passes() {
        let r = parse(&args(
            "tmpfsctl-web /var/cache/nginx -s -n -v -o rw,nosuid,size=1048576",
        ))
        .unwrap();
        assert_eq!(r.source, "tmpfsctl-web");
        assert_eq!(r.target, PathBuf::from("/var/cache/nginx"));
        assert!(r.sloppy && r.verbose && !r.fake);
        assert_eq!(r.options, ["rw", "nosuid", "size=1048576"]);
        let r = parse(&args("a /b -fv -N 1234 -t tmpfsctl -o x")).unwrap();
        assert!(r.fake && r.verbose);
        assert_eq!(r.namespace.as_deref(), Some("1234"));
    }

    #[test]
    fn refuses_bad_command_lines() {
        assert!(parse(&args("only-one")).unwrap_err().contains("got 1 argument"));
        assert!(parse(&args("a /b /c")).unwrap_err().contains("got 3 arguments"));
        assert!(parse(&args("a /b -o"))
            .unwrap_err()
            .contains("`-o` needs a value"));
        assert!(parse(&args("a /b -x"))
            .unwrap_err()
            .contains("unknown option `-x`"));
        assert!(parse(&args("a /b -o mpol=\"bind:0"))
            .unwrap_err()
            .contains("unbalanced quote"));
    }

    #[test]
    fn quoted_values_keep_their_commas() {
        let r = parse(&args("a /b -o size=1M,mpol=\"bind:0,2\",nodev")).unwrap();
        assert_eq!(r.options, ["size=1M", "mpol=\"bind:0,2\"", "nodev"]);
    }

    #[test]
    fn the_root_takes_the_disk_directorys_owner_and_mode() {
        let r = parse(&args(
            "tmpfsctl-web /c -o rw,nosuid,nodev,size=1048576,huge=never",
        ))
        .unwrap();
        let c = call(&r, Some(DISK)).unwrap();
        assert_eq!(c.data, "size=1048576,huge=never,mode=750,uid=33,gid=34");
        assert_eq!(c.flags, MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        assert!(!c.remount);
    }

    #[test]
    fn what_the_line_sets_wins_over_the_directory() {
        let r = parse(&args("s /c -o size=1M,mode=1733,gid=0")).unwrap();
        assert_eq!(
            call(&r, Some(DISK)).unwrap().data,
            "size=1M,mode=1733,gid=0,uid=33"
        );
        let r = parse(&args("s /c -o size=1M,mode=0700,uid=1,gid=2")).unwrap();
        assert_eq!(
            call(&r, Some(DISK)).unwrap().data,
            "size=1M,mode=0700,uid=1,gid=2"
        );
    }

    #[test]
    fn later_vfs_options_override_earlier_ones() {
        let r = parse(&args("s /c -o ro,noexec,exec,rw,noatime,strictatime")).unwrap();
        assert_eq!(
            call(&r, Some(DISK)).unwrap().flags,
            MsFlags::MS_NOATIME | MsFlags::MS_STRICTATIME
        );
    }

    #[test]
    fn userspace_options_never_reach_the_kernel() {
        let r = parse(&args(
            "s /c -o defaults,nofail,noauto,x-systemd.before=nginx.service,X-mount.mkdir,comment=x,_netdev,size=1M",
        ))
        .unwrap();
        assert_eq!(
            call(&r, Some(DISK)).unwrap().data,
            "size=1M,mode=750,uid=33,gid=34"
        );
    }

    #[test]
    fn unknown_options_reach_the_kernel_unless_sloppy() {
        let r = parse(&args("s /c -o size=1M,bogus=1")).unwrap();
        assert_eq!(
            call(&r, Some(DISK)).unwrap().data,
            "size=1M,bogus=1,mode=750,uid=33,gid=34"
        );
        let r = parse(&args("s /c -s -o size=1M,bogus=1")).unwrap();
        let c = call(&r, Some(DISK)).unwrap();
        assert_eq!(c.data, "size=1M,mode=750,uid=33,gid=34");
        assert_eq!(c.dropped, ["bogus=1"]);
    }

    #[test]
    fn a_remount_leaves_the_root_alone() {
        let r = parse(&args("s /c -o rw,remount,size=5M,nosuid")).unwrap();
        let c = call(&r, None).unwrap();
        assert!(c.remount);
        assert_eq!(c.data, "size=5M");
        assert_eq!(c.flags, MsFlags::MS_NOSUID);
    }

    #[test]
    fn other_kinds_of_mount_are_refused() {
        for o in ["bind", "rbind", "move"] {
            let r = parse(&args(&format!("s /c -o {o}"))).unwrap();
            assert!(
                call(&r, Some(DISK)).unwrap_err().contains("only mounts tmpfs"),
                "{o}"
            );
        }
    }
}
