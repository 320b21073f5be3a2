//! The specs in examples/ are valid, checked through `validate --root` in a
//! fake image (a temporary tree with the example's directories and its own
//! etc/passwd and etc/group), so they pass on a machine without www-data,
//! proxy or ci users; and `--root` really checks the tree, not the host
//! (for `validate` and `boot install`). And the README's layout names what
//! the tree holds.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{self, Sandbox};

/// `tmpfsctl validate SPEC --root ROOT`.
fn validate_in(sb: &Sandbox, spec: &Path, root: &Path) -> common::Run {
    sb.run([
        "validate".as_ref(),
        spec.as_os_str(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

/// The value of every `key: value` line of a mount (`path`, `owner`, `group`),
/// comments stripped.
fn values(yaml: &str, key: &str) -> BTreeSet<String> {
    yaml.lines()
        .filter_map(|l| {
            let l = l.split(" #").next().unwrap().trim();
            let l = l.strip_prefix("- ").unwrap_or(l);
            l.strip_prefix(&format!("{key}:"))
                .map(|v| v.trim().trim_matches('"').to_string())
        })
        .filter(|v| !v.is_empty())
        .collect()
}

/// A fake image for `yaml`: its paths as directories, its users and groups
/// (and root) in etc/passwd and etc/group, with ids unknown to the host.
fn fake_root(sb: &Sandbox, name: &str, yaml: &str) -> PathBuf {
    let root = sb.path(name);
    for p in values(yaml, "path") {
        fs::create_dir_all(root.join(p.trim_start_matches('/'))).unwrap();
    }
    let mut names = values(yaml, "owner");
    names.extend(values(yaml, "group"));
    names.remove("root");
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
    let mut group = String::from("root:x:0:\n");
    for (i, n) in names.iter().enumerate() {
        let id = 61000 + i;
        passwd.push_str(&format!("{n}:x:{id}:{id}::/nonexistent:/usr/sbin/nologin\n"));
        group.push_str(&format!("{n}:x:{id}:\n"));
    }
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/passwd"), passwd).unwrap();
    fs::write(root.join("etc/group"), group).unwrap();
    root
}

#[test]
fn every_example_is_valid_in_a_fake_root() {
    let sb = Sandbox::new();
    let all = examples();
    for app in [
        "nginx-proxy-cache",
        "apache-cache-disk",
        "squid-cache-dir",
        "php-sessions-opcache",
        "ci-build-cache",
        "overlay-build-cache",
        "demo",
    ] {
        assert!(
            all.iter().any(|p| p.file_stem().unwrap() == app),
            "examples/{app}.yaml is missing"
        );
    }
    for (i, ex) in all.iter().enumerate() {
        let yaml = fs::read_to_string(ex).unwrap();
        assert!(
            yaml.starts_with("# yaml-language-server: $schema=../docs/tmpfsctl.schema.json\n"),
            "{}: no schema modeline",
            ex.display()
        );
        let root = fake_root(&sb, &format!("root{i}"), &yaml);
        validate_in(&sb, ex, &root).code(0).stdout_has("valid");
    }
}

#[test]
fn an_example_in_an_empty_root_names_what_is_missing_there() {
    let sb = Sandbox::new();
    let root = sb.path("empty");
    common::root_only_users(&root);
    let ex = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/squid-cache-dir.yaml");
    validate_in(&sb, &ex, &root)
        .code(2)
        .stderr_has("path `/var/spool/squid` does not exist in ")
        .stderr_has("unknown user `proxy` in ")
        .stderr_has("unknown group `proxy` in ")
        .stderr_has("etc/passwd");
}

/// A path, user and group that exist only on the host are not in the image;
/// ones that exist only in the image are.
#[test]
fn root_is_checked_instead_of_the_host() {
    let sb = Sandbox::new();
    let host_only = sb.cache_dir("host-only", 0, 0, 0o755);
    let spec = sb.one_mount_spec("c", &host_only, "8MiB", "    owner: root\n");
    let image = sb.path("image");
    fs::create_dir_all(image.join("etc")).unwrap();
    fs::write(image.join("etc/passwd"), "img:x:4242:4242::/:/bin/sh\n").unwrap();
    fs::write(image.join("etc/group"), "img:x:4242:\n").unwrap();
    validate_in(&sb, &spec, &image)
        .code(2)
        .stderr_has("does not exist in")
        .stderr_has("unknown user `root`");

    // Only in the image: a directory, a user the host does not know.
    let spec = sb.write_spec(
        "image.yaml",
        "version: 1\nmounts:\n  - name: c\n    path: /srv/tmpfsctl-image-only/cache\n    size: 8MiB\n    owner: img\n    group: img\n",
    );
    fs::create_dir_all(image.join("srv/tmpfsctl-image-only/cache")).unwrap();
    sb.run(["validate".as_ref(), spec.as_os_str()]).code(2);
    validate_in(&sb, &spec, &image).code(0);

    // A symlink inside the image is caught there, and named as the image sees it.
    fs::create_dir_all(image.join("var/real")).unwrap();
    std::os::unix::fs::symlink("/var/real", image.join("var/link")).unwrap();
    let spec = sb.write_spec(
        "link.yaml",
        "version: 1\nmounts:\n  - name: c\n    path: /var/link\n    size: 8MiB\n",
    );
    validate_in(&sb, &spec, &image)
        .code(2)
        .stderr_has("passes through the symlink `/var/link` -> `/var/real`");

    // boot install --root checks the same way.
    let spec = sb.write_spec(
        "image.yaml",
        "version: 1\nmounts:\n  - name: c\n    path: /srv/tmpfsctl-image-only/cache\n    size: 8MiB\n    owner: img\n    group: img\n",
    );
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--root".as_ref(),
        image.as_os_str(),
        "--binary".as_ref(),
        "/usr/bin/tmpfsctl".as_ref(),
        "--spec-path".as_ref(),
        "/etc/tmpfsctl/cache.yaml".as_ref(),
    ])
    .code(0);
    assert!(image.join("etc/systemd/system/tmpfsctl-apply.service").exists());
    let host = sb.one_mount_spec("c", &host_only, "8MiB", "");
    let other = sb.path("other");
    fs::create_dir_all(&other).unwrap();
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        host.as_os_str(),
        "--root".as_ref(),
        other.as_os_str(),
    ])
    .code(2)
    .stderr_has("does not exist in");
    assert!(!other.join("etc").exists(), "boot install wrote into the root");
}

/// The words of a description in the README's layout that name a file (by
/// its extension) or a directory (by its trailing slash); prose such as
/// `install/remove` is neither.
fn layout_tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .map(|t| t.trim_end_matches('.'))
        .filter(|t| {
            let ext = [".rs", ".sh", ".py", ".yaml", ".yml", ".json", ".md", ".toml"];
            !t.starts_with('/') && (t.ends_with('/') || ext.iter().any(|e| t.ends_with(e)))
        })
}

/// The README's `## Layout` is true: every path it names exists, and every
/// top-level module of the crate (`src/X.rs`, or `src/X/` with a mod.rs) is
/// named. A path in a description may be relative to the repository, to the
/// entry's directory or the one above it (`copy/sync.rs` under `src/copy/`),
/// or to the directory named last in the entry (`evict.rs` after `src/agent/`).
#[test]
fn readme_layout_names_what_exists_and_every_module() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(repo.join("README.md")).unwrap();
    let section = readme
        .split("\n## Layout\n")
        .nth(1)
        .expect("a `## Layout` section");
    let block = section
        .split("```")
        .nth(1)
        .expect("a fenced block in `## Layout`");
    let shown = |p: &Path| {
        let rel = p.strip_prefix(repo).unwrap().display().to_string();
        if p.is_dir() {
            format!("{rel}/")
        } else {
            rel
        }
    };
    let mut named = BTreeSet::new();
    let mut missing = Vec::new();
    let (mut entry, mut last_dir) = (repo.to_path_buf(), repo.to_path_buf());
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let mut desc = line;
        if !line.starts_with(' ') {
            // The entry's own paths: up to the first space not after a comma.
            let end = line
                .char_indices()
                .find(|&(i, c)| c == ' ' && !line[..i].ends_with(','))
                .map_or(line.len(), |(i, _)| i);
            let (head, rest) = line.split_at(end);
            desc = rest;
            for (i, p) in head.split(", ").enumerate() {
                let path = repo.join(p.trim());
                if !path.exists() {
                    missing.push(p.trim().to_string());
                    continue;
                }
                if i == 0 {
                    entry = if path.is_dir() {
                        path.clone()
                    } else {
                        path.parent().unwrap().to_path_buf()
                    };
                    last_dir = entry.clone();
                }
                named.insert(shown(&path));
            }
        }
        for t in layout_tokens(desc) {
            let bases = [repo, &entry, entry.parent().unwrap_or(repo), &last_dir];
            match bases.iter().map(|b| b.join(t)).find(|p| p.exists()) {
                Some(p) => {
                    if p.is_dir() {
                        last_dir = p.clone();
                    }
                    named.insert(shown(&p));
                }
                None => missing.push(t.to_string()),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the README's layout names what does not exist: {missing:?}"
    );

    let mut unnamed = Vec::new();
    for e in fs::read_dir(repo.join("src")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let module = if name.ends_with(".rs") {
            format!("src/{name}")
        } else if repo.join("src").join(&name).join("mod.rs").exists() {
            format!("src/{name}/")
        } else {
            continue; // the submodules of src/{name}.rs
        };
        if !named.contains(&module) {
            unnamed.push(module);
        }
    }
    unnamed.sort();
    assert!(
        unnamed.is_empty(),
        "modules the README's layout does not name: {unnamed:?}"
    );
}
