//! `seed: copy` against a hostile unprivileged user (uid 65534) who owns the cache
//! directory and works in it, in RAM and on disk, while root's write-back runs:
//! nothing root kept from it becomes readable to it, or its own data root's.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use crate::common::Sandbox;

/// Runs `script` with sh as uid and gid 65534; its output.
fn as_nobody(script: &str) -> String {
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A sandbox whose cache directory (`cache`, uid 65534) the user can reach, with the
/// mount `c` on it, and the spec.
fn users_cache() -> (Sandbox, std::path::PathBuf, std::path::PathBuf) {
    let sb = Sandbox::new();
    fs::set_permissions(&sb.root, fs::Permissions::from_mode(0o755)).unwrap();
    let cache = sb.cache_dir("cache", 65_534, 65_534, 0o755);
    let spec = sb.one_mount_spec("c", &cache, "16MiB", "    persist: on-stop\n");
    (sb, cache, spec)
}

fn mode(p: &std::path::Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// Root's 0600 file in the user's cache: in RAM the user replaces it by one of its
/// own of the same size and mtime (stat shows both), mode 0644. Only owner and mode
/// differ then; the write-back must not give root's disk inode, with its data, that
/// owner and mode, but write the user's file.
#[test]
fn a_users_file_in_place_of_roots_does_not_get_roots_data() {
    let (sb, cache, spec) = users_cache();
    let secret = cache.join("secret");
    fs::write(&secret, "ROOT-SECRET-0123456789").unwrap();
    mode(&secret, 0o600);
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    let p = secret.display();
    as_nobody(&format!(
        "sz=$(stat -c %s {p}); mt=$(stat -c %y {p}); rm -f {p}; head -c $sz /dev/zero > {p}; \
         chmod 0644 {p}; touch -m -d \"$mt\" {p}"
    ));
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    let md = fs::metadata(&secret).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (65_534, 0o644));
    assert_eq!(
        fs::read(&secret).unwrap(),
        vec![0u8; 22],
        "root's data under the user's owner"
    );
}

/// The other way: root's setuid file, which the user renames in RAM over its own
/// file of the same size and mtime: the disk name gets root's file, not the user's
/// data with root's owner and mode.
#[test]
fn roots_file_moved_over_the_users_does_not_make_its_data_roots() {
    let (sb, cache, spec) = users_cache();
    let tool = cache.join("tool");
    fs::write(&tool, "#!/bin/sh\necho root tool\n").unwrap();
    mode(&tool, 0o4755);
    let (c, t) = (cache.display(), tool.display());
    as_nobody(&format!(
        "printf '#!/bin/sh\\nid  # theirs x\\n' > {c}/mine; truncate -s $(stat -c %s {t}) {c}/mine; \
         touch -m -d \"$(stat -c %y {t})\" {c}/mine"
    ));
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    as_nobody(&format!("rm {c}/mine && mv {t} {c}/mine"));
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    let md = fs::metadata(cache.join("mine")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o4755));
    assert_eq!(
        fs::read_to_string(cache.join("mine")).unwrap(),
        "#!/bin/sh\necho root tool\n"
    );
}

/// Root's 0700 directory in the user's cache, holding a 0644 file: in RAM the user
/// moves it aside and makes its own 0777 directory at the name. On disk, while
/// `down` removes what the RAM deleted (stopped just before), the user cannot read
/// the file through root's directory: it gets the user's owner and mode only once
/// the file is gone from it.
#[test]
fn a_directory_made_in_place_of_roots_is_the_users_only_once_emptied() {
    let (sb, cache, spec) = users_cache();
    let private = cache.join("private");
    fs::create_dir(&private).unwrap();
    fs::write(private.join("key"), "ROOT-KEY").unwrap();
    mode(&private.join("key"), 0o644);
    mode(&private, 0o700);
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    let (c, p) = (cache.display(), private.display());
    as_nobody(&format!("mv {p} {c}/aside && mkdir {p} && chmod 0777 {p}"));
    let mut read = String::new();
    let (code, log) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=before-removals",
        &["before-removals"],
        |_| read = as_nobody(&format!("cat {p}/key")),
    );
    assert_eq!(code, 0, "{log}");
    assert!(!read.contains("ROOT-KEY"), "the user read root's file: {read:?}");
    let md = fs::metadata(&private).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (65_534, 0o777));
    assert_eq!(fs::read_dir(&private).unwrap().count(), 0);
    let aside = fs::metadata(cache.join("aside")).unwrap();
    assert_eq!((aside.uid(), aside.mode() & 0o7777), (0, 0o700));
    assert_eq!(fs::read_to_string(cache.join("aside/key")).unwrap(), "ROOT-KEY");
}

/// An access ACL is permission bits too. Root's file `a`, readable by the user
/// through its ACL, and root's `b`, which it may not read, of the same size, mode
/// and mtime: the user renames `a` over `b` in RAM. The disk's `b` must not get
/// `a`'s ACL with `b`'s data in it.
#[test]
fn an_acl_moved_over_a_name_does_not_open_its_disk_data() {
    let (sb, cache, spec) = users_cache();
    let acl = crate::common_copy::acl_granting(65_534, 4);
    let (a, b) = (cache.join("a"), cache.join("b"));
    fs::write(&a, "AAAA").unwrap();
    fs::write(&b, "BBBB").unwrap();
    mode(&a, 0o640);
    mode(&b, 0o640);
    xattr::set(&a, "system.posix_acl_access", &acl).unwrap();
    let when = nix::sys::time::TimeSpec::new(1_700_000_000, 0);
    for p in [&a, &b] {
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            p.as_path(),
            &when,
            &when,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
    }
    assert!(!as_nobody(&format!("cat {}", b.display())).contains("BBBB"));
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    as_nobody(&format!(
        "rm {} && mv {} {}",
        b.display(),
        a.display(),
        b.display()
    ));
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    let read = as_nobody(&format!("cat {}", b.display()));
    assert!(
        !read.contains("BBBB"),
        "the user read root's b through a's ACL: {read:?}"
    );
    assert_eq!(fs::read_to_string(&b).unwrap(), "AAAA");
}
