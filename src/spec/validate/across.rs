//! What one mount may not do to another: share a name or a directory, lie
//! inside another, or together exceed the RAM budget.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::Ctx;
use crate::spec::raw::RawMount;
use crate::spec::size;
use crate::spec::MountSpec;

/// The valid mounts so far, and what they claim.
pub(super) struct Claimed {
    mounts: Vec<(usize, MountSpec)>,
    by_name: HashMap<String, usize>,
    /// Existing directories by (device, inode): one directory can have two
    /// paths (a bind mount), and two tmpfs over it would hide each other.
    by_dir: HashMap<(u64, u64), (usize, PathBuf)>,
    /// Since the last budget overrun, so that each overrun is reported once.
    budget_used: u64,
    mem_total: u64,
    max_total: u64,
}

impl Claimed {
    pub(super) fn new(mem_total: u64, max_total: u64) -> Self {
        Claimed {
            mounts: Vec::new(),
            by_name: HashMap::new(),
            by_dir: HashMap::new(),
            budget_used: 0,
            mem_total,
            max_total,
        }
    }

    /// Checks mounts[i] (valid on its own) against the mounts before it.
    pub(super) fn add(&mut self, cx: &mut Ctx, i: usize, m: &RawMount, spec: MountSpec) {
        // `mount` returns a spec only when all three are there.
        let (Some(m_name), Some(m_path), Some(m_size)) = (&m.name, &m.path, &m.size) else {
            return;
        };
        let field = |f: &str| format!("mounts[{i}].{f}");
        if let Some(prev) = self.by_name.insert(spec.name.clone(), i) {
            cx.at(
                m_name,
                &field("name"),
                format!("duplicate mount name `{}` (also mounts[{prev}])", spec.name),
                Some("a name unique within the spec"),
            );
        }
        if let Some((j, other)) = self.same_directory(cx, i, &spec) {
            cx.at(
                m_path,
                &field("path"),
                format!(
                    "`{}` is the same directory as mounts[{j}] `{}` (a bind mount?)",
                    spec.path.display(),
                    other.display()
                ),
                Some("each directory managed once"),
            );
        }
        for (j, other) in &self.mounts {
            if other.path == spec.path {
                cx.at(
                    m_path,
                    &field("path"),
                    format!("duplicate path `{}` (also mounts[{j}])", spec.path.display()),
                    Some("each path managed once"),
                );
            } else if other.path.starts_with(&spec.path) || spec.path.starts_with(&other.path) {
                cx.at(
                    m_path,
                    &field("path"),
                    format!(
                        "`{}` and mounts[{j}] `{}` are nested; one tmpfs would hide the other",
                        spec.path.display(),
                        other.path.display()
                    ),
                    Some("paths that are not inside one another"),
                );
            }
        }
        self.budget_used = self.budget_used.saturating_add(spec.size);
        if self.budget_used > self.max_total {
            cx.at(
                m_size,
                &field("size"),
                format!(
                    "total size {} of mounts[0..={i}] exceeds the RAM budget max_total {} (MemTotal {})",
                    size::format_bytes(self.budget_used),
                    size::format_bytes(self.max_total),
                    size::format_bytes(self.mem_total)
                ),
                Some("smaller sizes, or a larger top-level `max_total` (default 50% of MemTotal)"),
            );
            self.budget_used = 0;
        }
        self.mounts.push((i, spec));
    }

    /// An earlier mount whose existing directory is this one's under another
    /// path; else this one's directory is remembered.
    fn same_directory(&mut self, cx: &Ctx, i: usize, spec: &MountSpec) -> Option<(usize, PathBuf)> {
        let md = cx
            .paths
            .tree()
            .and_then(|_| std::fs::metadata(cx.paths.host_path(&spec.path)).ok())?;
        let id = (md.dev(), md.ino());
        // The same path twice is reported by `add` as a duplicate.
        match self.by_dir.get(&id).filter(|(_, p)| *p != spec.path) {
            Some(found) => Some(found.clone()),
            None => {
                self.by_dir.insert(id, (i, spec.path.clone()));
                None
            }
        }
    }

    pub(super) fn into_mounts(self) -> Vec<MountSpec> {
        self.mounts.into_iter().map(|(_, m)| m).collect()
    }
}
