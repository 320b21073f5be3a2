//! Progress of a long seed and write-back: `status` shows it while it runs
//! (from the record the working process keeps in the state directory), a
//! process without a terminal logs it, and nothing is left once it is done.

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::Sandbox;

#[test]
fn status_shows_a_seed_and_a_write_back_while_they_run() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let n = 40_000;
    for d in 0..40 {
        let dir = cache.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..n / 40 {
            fs::write(dir.join(format!("f{i}")), [b'x'; 512]).unwrap();
        }
    }
    let spec = sb.one_mount_spec("cache", &cache, "256MiB", "    persist: on-stop\n");

    for (command, op) in [("apply", "seed"), ("sync", "write-back")] {
        if op == "write-back" {
            // Every file changed in RAM: the write-back has them all to write.
            for d in 0..40 {
                for i in 0..n / 40 {
                    fs::write(cache.join(format!("d{d}/f{i}")), [b'y'; 600]).unwrap();
                }
            }
        }
        let mut c = sb.cmd();
        let mut child = c
            .args([command.as_ref(), spec.as_os_str()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = Instant::now();
        let mut seen = None;
        while child.try_wait().unwrap().is_none() {
            let r = sb.run([
                "status".as_ref(),
                spec.as_os_str(),
                "--format".as_ref(),
                "json".as_ref(),
            ]);
            if let Some(p) = r.code(0).json()["mounts"][0]
                .get("progress")
                .filter(|p| p["entries"].as_u64() > Some(0) && p["op"] == op)
            {
                seen.get_or_insert_with(|| p.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let took = started.elapsed();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{command}: {stderr}");
        let p = seen.unwrap_or_else(|| panic!("{command} ran {took:?} and status never showed its progress"));
        assert_eq!(p["op"], op, "{p}");
        assert_eq!(p["pid"].as_u64(), Some(u64::from(pid)), "{p}");
        if op == "seed" {
            assert_eq!(p["entries_total"].as_u64(), Some(n as u64 + 40), "{p}");
            assert!(p["bytes_total"].as_u64() >= Some(n as u64 * 512), "{p}");
        }
        // Without a terminal, a run past two seconds logs its progress.
        let verb = if op == "seed" {
            "seeding cache:"
        } else {
            "writing back cache:"
        };
        if took > Duration::from_secs(3) {
            assert!(
                stderr.contains(verb),
                "{command} ran {took:?} without a progress line:\n{stderr}"
            );
        }
        let after = sb.run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ]);
        assert!(after.json()["mounts"][0].get("progress").is_none(), "{after}");
        assert!(!sb.state.join("mounts/cache.progress.json").exists());
    }
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
}
