#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: tmpfsctl contributors
# MIT OR Apache-2.0, as tmpfsctl

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: spec
short_description: Put application cache directories into RAM with tmpfsctl
version_added: "0.1.0"
description:
  - Writes a tmpfsctl spec (optional), validates it and converges the host to it with
    C(tmpfsctl apply), so that every managed directory becomes a size-limited tmpfs seeded from
    its on-disk contents.
  - Installs the boot integration (C(tmpfsctl boot install)) so the mounts come back at
    every boot, and enables and starts the usage watchdog (C(tmpfsctl-agent.service)).
  - With O(state=absent), takes every mount of the spec down (the application is back
    on its disk directory, persisted mounts written back), removes the boot integration
    and the spec file.
  - Exit status 3 of tmpfsctl (a mount degraded to its disk directory) is a warning
    unless O(fail_on_degraded=true); exit status 1, 2 and 4 fail the task with
    tmpfsctl's own message (for a bad spec, C(file:line:col), the field and what is accepted).
author:
  - tmpfsctl contributors
requirements:
  - tmpfsctl on the managed host
  - PyYAML on the managed host when O(spec) is given or O(agent) is left to its default
options:
  path:
    description:
      - Where the spec lives on the host.
      - tmpfsctl refuses, as root, a spec that is not owned by root, is writable by group
        or others, or lies in a directory another user could change.
    type: path
    default: /etc/tmpfsctl/cache.yaml
  spec:
    description:
      - The spec's content (see the tmpfsctl README, "Spec reference"), written as YAML to
        O(path) atomically, owned by root, mode 0644, after it was validated.
      - Omitted, the file at O(path) is used as it is.
      - Quote octal modes, for example V("0750"), because an unquoted V(0750) is the integer 488 in YAML.
    type: dict
  state:
    description:
      - V(present) validates the spec, then applies it (and installs the boot integration).
      - V(absent) runs C(tmpfsctl down) for every mount of the spec, then removes the boot
        integration and the spec file.
    type: str
    choices: [present, absent]
    default: present
  boot:
    description:
      - How the mounts come back after a reboot (C(tmpfsctl boot install --mode)).
      - V(none) installs nothing and leaves whatever boot integration exists as it is;
        with O(state=absent) it also leaves it.
      - V(systemd) runs C(systemctl daemon-reload) when the units changed, and starts
        C(tmpfsctl-apply.service) and C(tmpfsctl-down.service) when they are not active, so
        that the shutdown write-back (the down unit's C(ExecStop)) runs already at the next
        shutdown.
    type: str
    choices: [systemd, fstab, sysv, none]
    default: systemd
  agent:
    description:
      - Enable and start C(tmpfsctl-agent.service) (the watchdog; needs systemd).
      - Default true when any mount has a O(spec.mounts[].watchdog) or C(persist every ...).
      - V(false) does not start or enable it; note that O(boot=systemd) enables the agent unit
        for the next boot as part of the boot integration.
    type: bool
  fail_on_degraded:
    description:
      - Fail the task when a mount is degraded (its application kept on its disk directory)
        or a change was refused (tmpfsctl exit status 3). By default it is a warning.
    type: bool
    default: false
  binary:
    description:
      - The tmpfsctl executable, a name looked up on PATH or an absolute path.
    type: str
    default: tmpfsctl
  state_dir:
    description:
      - tmpfsctl's state directory (C(--state-dir)). Operators leave it unset (tmpfsctl's
        default C(/run/tmpfsctl)); tests point it to a throwaway directory.
    type: path
attributes:
  check_mode:
    support: full
    description: Runs C(tmpfsctl plan) against the new spec; nothing on the host is touched.
  diff_mode:
    support: full
    description: Shows the spec file's diff and tmpfsctl's plan.
notes:
  - The module must run as root (C(become=true)).
  - In check mode the new spec is validated and planned from a private temporary copy.
    Whether O(boot) would rewrite boot files is estimated (changed when the spec changes
    or no boot manifest exists).
"""

EXAMPLES = r"""
- name: Offload nginx's proxy cache into a 512 MiB tmpfs
  tmpfsctl.offload.spec:
    spec:
      version: 1
      mounts:
        - name: nginx
          path: /var/cache/nginx
          size: 512MiB
          owner: www-data
          group: www-data
          mode: "0750"
          before: [nginx.service]
          watchdog: {high: 90%, action: evict}
  become: true

- name: Apply a spec file that is already on the host, no boot integration
  tmpfsctl.offload.spec:
    path: /etc/tmpfsctl/cache.yaml
    boot: none

- name: Fail the play when a cache could not be offloaded
  tmpfsctl.offload.spec:
    fail_on_degraded: true

- name: Give every cache back to its disk, remove the boot units and the spec
  tmpfsctl.offload.spec:
    state: absent
"""

RETURN = r"""
changed:
  description: Whether the spec file, a mount, the boot integration or the agent changed.
  returned: always
  type: bool
rc:
  description: Exit status of the last tmpfsctl command that ran (0 converged, 3 degraded).
  returned: always
  type: int
  sample: 0
degraded:
  description: Names of the mounts that are degraded (the application stays on its disk directory).
  returned: always
  type: list
  elements: str
  sample: [nginx]
refused:
  description: Names of the mounts where a change was refused (e.g. shrinking below current usage).
  returned: always
  type: list
  elements: str
mounts:
  description:
    - With O(state=present), C(tmpfsctl apply --format json)'s per-mount results (name, path,
      result, steps, seeded, reason); in check mode, C(tmpfsctl plan --format json)'s per-mount plans.
    - With O(state=absent), C(tmpfsctl down --format json)'s per-mount results.
  returned: always
  type: list
  elements: dict
  sample:
    - name: nginx
      path: /var/cache/nginx
      result: changed
      steps: ["bind /var/cache/nginx to /run/tmpfsctl/lower/nginx (private)"]
agent:
  description: Whether the module ensured that C(tmpfsctl-agent.service) is enabled and running.
  returned: always
  type: bool
spec_changed:
  description: Whether the spec file was (or in check mode would be) written or removed.
  returned: always
  type: bool
boot:
  description: C(tmpfsctl boot install/remove --format json)'s report, when it ran.
  returned: when boot integration was installed or removed
  type: dict
msg:
  description: What happened; on failure tmpfsctl's own error, with C(file:line:col) for a bad spec.
  returned: always
  type: str
stdout:
  description: Standard output of the last tmpfsctl command.
  returned: always
  type: str
stderr:
  description: Standard error of the last tmpfsctl command.
  returned: always
  type: str
"""

import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

try:
    import yaml

    HAS_YAML = True
except ImportError:  # pragma: no cover
    HAS_YAML = False

HEADER = "# Managed by Ansible (tmpfsctl.offload.spec): edits here are overwritten.\n"
AGENT_UNIT = "tmpfsctl-agent.service"
BOOT_UNITS = ["tmpfsctl-apply.service", "tmpfsctl-down.service"]
MANIFEST = "/etc/tmpfsctl/boot.manifest"


class Runner(object):
    def __init__(self, module, binary, state_dir):
        self.module = module
        self.binary = binary
        self.state_dir = state_dir
        self.last = (0, "", "")

    def run(self, args, ok=(0,), what=None):
        cmd = [self.binary] + args
        if self.state_dir:
            cmd += ["--state-dir", self.state_dir]
        rc, out, err = self.module.run_command(cmd)
        self.last = (rc, out, err)
        if rc not in ok:
            self.fail(rc, out, err, what or " ".join(args[:1]))
        return rc, out, err

    def fail(self, rc, out, err, what, **extra):
        text = (err or out or "").strip()
        self.module.fail_json(
            msg="tmpfsctl %s failed (exit %d): %s" % (what, rc, text),
            rc=rc,
            stdout=out,
            stderr=err,
            **extra
        )


def fail(module, result, msg, **extra):
    """fail_json with everything gathered so far; `msg` and `extra` win."""
    out = dict(result)
    out.pop("diff", None)
    out.update(extra)
    out["msg"] = msg
    module.fail_json(**out)


def render(spec):
    return HEADER + yaml.safe_dump(spec, default_flow_style=False, sort_keys=False, allow_unicode=True)


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def wants_agent(spec):
    """True when any mount has a watchdog or `persist: every ...`."""
    if not isinstance(spec, dict):
        return False
    defaults = spec.get("defaults") or {}
    for m in spec.get("mounts") or []:
        if not isinstance(m, dict):
            continue
        if m.get("watchdog") or defaults.get("watchdog"):
            return True
        persist = m.get("persist", defaults.get("persist"))
        if isinstance(persist, str) and persist.strip().startswith("every"):
            return True
    return False


def write_candidate(directory, content):
    """A root-owned 0644 file with `content` in `directory`; returns its path."""
    fd, tmp = tempfile.mkstemp(prefix=".tmpfsctl-spec.", suffix=".yaml", dir=directory)
    try:
        os.write(fd, to_bytes(content))
        os.fsync(fd)
        os.fchmod(fd, 0o644)
        os.fchown(fd, 0, 0)
    finally:
        os.close(fd)
    return tmp


def fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path):
    """Create the spec's directory root-owned 0755 (parents too); True when created."""
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(path.rstrip("/")) or "/"
    ensure_dir(parent)
    os.mkdir(path, 0o755)
    os.chown(path, 0, 0)
    os.chmod(path, 0o755)
    return True


def systemctl(module, *args):
    bin_ = module.get_bin_path("systemctl")
    if not bin_:
        return None
    return module.run_command([bin_] + list(args))


def present(module, runner, result):
    p = module.params
    path = p["path"]
    check = module.check_mode
    old = read_text(path)
    spec_data = p["spec"]
    candidate = None
    tmpdir = None

    if spec_data is not None:
        if not HAS_YAML:
            module.fail_json(msg="PyYAML is needed on the managed host to write `spec`")
        new = render(spec_data)
        spec_changed = new != old
    else:
        if old is None:
            module.fail_json(msg="%s does not exist and no `spec` was given" % path)
        new = old
        spec_changed = False
        if HAS_YAML:
            try:
                spec_data = yaml.safe_load(old)
            except yaml.YAMLError:
                spec_data = None  # tmpfsctl validate says what is wrong, with file:line
    result["spec_changed"] = spec_changed
    if module._diff:
        result["diff"].append(
            {"before_header": path, "after_header": path, "before": old or "", "after": new}
        )

    # The file tmpfsctl reads: the spec itself, or (changed spec) a root-only
    # candidate, renamed into place only after validation.
    target = path
    try:
        if spec_changed:
            directory = os.path.dirname(path) or "/"
            if check or not os.path.isdir(directory):
                if check:
                    tmpdir = tempfile.mkdtemp(prefix="tmpfsctl-check.")
                    directory = tmpdir
                else:
                    ensure_dir(directory)
            candidate = write_candidate(directory, new)
            target = candidate

        rc, out, err = runner.run(["validate", target], ok=(0, 1, 2, 3, 4))
        if rc != 0:
            text = (err or out).strip()
            if candidate:
                text = text.replace(candidate, path)
            module.fail_json(
                msg="tmpfsctl validate failed (exit %d): %s" % (rc, text),
                rc=rc, stdout=out.replace(candidate or path, path), stderr=err.replace(candidate or path, path),
                spec_changed=spec_changed, degraded=[], refused=[], mounts=[],
            )

        if module._diff or check:
            rc, out, err = runner.run(["plan", target, "--format", "json"], ok=(0,), what="plan")
            try:
                plan = json.loads(out)
            except ValueError:
                runner.fail(rc, out, err, "plan (output is not JSON)")
            plan_changed = bool(plan.get("changed"))
            if check:
                result["mounts"] = plan.get("plan", {}).get("mounts", [])
                result["changed"] = result["changed"] or spec_changed or plan_changed
            if module._diff and plan_changed:
                _, human, _ = runner.run(["plan", target], ok=(0,), what="plan")
                if candidate:
                    human = human.replace(candidate, path)
                result["diff"].append({
                    "before_header": "tmpfsctl plan: the host now",
                    "after_header": "tmpfsctl plan: after apply",
                    "before": "",
                    "after": human,
                })

        if check:
            if p["boot"] != "none" and (spec_changed or not os.path.exists(MANIFEST)):
                result["changed"] = True
            if p["boot"] == "systemd":
                start_boot_units(module, result)
            return spec_data

        if spec_changed:
            os.rename(candidate, path)
            candidate = None
            fsync_dir(os.path.dirname(path) or "/")
            result["changed"] = True
    finally:
        if candidate and os.path.exists(candidate):
            os.unlink(candidate)
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)

    rc, out, err = runner.run(["apply", path, "--format", "json"], ok=(0, 1, 2, 3, 4))
    report = None
    try:
        report = json.loads(out) if out.strip() else None
    except ValueError:
        report = None
    mounts = (report or {}).get("mounts", [])
    result["mounts"] = mounts
    result["degraded"] = [m.get("name") for m in mounts if m.get("result") == "degraded"]
    result["refused"] = [m.get("name") for m in mounts if m.get("result") == "refused"]
    result["rc"] = rc
    if report and report.get("changed"):
        result["changed"] = True
    if rc in (1, 2, 4):
        failed = [
            "%s: %s" % (m.get("name"), m.get("reason") or m.get("result"))
            for m in mounts if m.get("result") in ("failed", "refused", "degraded")
        ]
        text = (err or "").strip() or "; ".join(failed) or out.strip()
        fail(module, result, "tmpfsctl apply failed (exit %d): %s" % (rc, text), stdout=out, stderr=err)
    if rc == 3:
        why = "; ".join(
            "%s %s: %s" % (m.get("name"), m.get("result"), m.get("reason", ""))
            for m in mounts if m.get("result") in ("degraded", "refused")
        )
        if p["fail_on_degraded"]:
            fail(module, result, "tmpfsctl apply: not fully converged (exit 3): %s" % why, stdout=out, stderr=err)
        module.warn("tmpfsctl apply: not fully converged (exit 3): %s" % why)
    return spec_data


def boot_install(module, runner, result):
    mode = module.params["boot"]
    if mode == "none":
        return
    dummy, out, dummy = runner.run(
        ["boot", "install", module.params["path"], "--mode", mode, "--format", "json"], what="boot install"
    )
    try:
        report = json.loads(out)
    except ValueError:
        report = {"output": out}
    result["boot"] = report
    if report.get("changed"):
        result["changed"] = True
        if mode == "systemd" and systemd_running(module):
            systemctl(module, "daemon-reload")
    if mode == "systemd":
        start_boot_units(module, result)


def systemd_running(module):
    return bool(module.get_bin_path("systemctl")) and os.path.isdir("/run/systemd/system")


def start_boot_units(module, result):
    """Start the apply and down units now, not only at the next boot.

    tmpfsctl-down.service writes persisted mounts back in its ExecStop=,
    which systemd runs only for a unit that was started: without this, a
    reboot right after the first run would lose what the application wrote
    into RAM. Starting the apply unit runs `apply` once more (nothing to do)
    and orders the shutdown as at a boot.
    """
    if not systemd_running(module):
        return
    inactive = [u for u in BOOT_UNITS if systemctl(module, "is-active", "--quiet", u)[0] != 0]
    if not inactive:
        return
    result["changed"] = True
    if module.check_mode:
        return
    rc, out, err = systemctl(module, "start", *inactive)
    if rc != 0:
        fail(module, result, "systemctl start %s failed: %s" % (" ".join(inactive), (err or out).strip()))


def ensure_agent(module, result, spec_data):
    want = module.params["agent"]
    explicit = want is not None
    if want is None:
        want = wants_agent(spec_data)
    if not want:
        return
    result["agent"] = True
    if not systemd_running(module):
        text = "agent: systemd is not running here; run `tmpfsctl agent SPEC` under your init system"
        if explicit:
            fail(module, result, text)
        module.warn(text)
        return
    enabled = systemctl(module, "is-enabled", "--quiet", AGENT_UNIT)[0] == 0
    active = systemctl(module, "is-active", "--quiet", AGENT_UNIT)[0] == 0
    if enabled and active:
        return
    result["changed"] = True
    if module.check_mode:
        return
    rc, out, err = systemctl(module, "enable", "--now", AGENT_UNIT)
    if rc != 0:
        fail(module, result, "systemctl enable --now %s failed: %s" % (AGENT_UNIT, (err or out).strip()))


def absent(module, runner, result):
    p = module.params
    path = p["path"]
    check = module.check_mode
    exists = os.path.exists(path)
    result["spec_changed"] = exists
    if module._diff and exists:
        result["diff"].append({"before_header": path, "after_header": path,
                               "before": read_text(path) or "", "after": ""})
    if check:
        result["changed"] = exists or (p["boot"] != "none" and os.path.exists(MANIFEST))
        return
    if exists:
        # The agent would act on mounts being taken down: stop it first.
        if p["boot"] == "systemd" and module.get_bin_path("systemctl"):
            if systemctl(module, "is-active", "--quiet", AGENT_UNIT)[0] == 0:
                systemctl(module, "stop", AGENT_UNIT)
                result["changed"] = True
        rc, out, err = runner.run(["down", path, "--format", "json"], ok=(0, 1, 2, 3, 4))
        result["rc"] = rc
        try:
            mounts = json.loads(out) if out.strip() else []
        except ValueError:
            mounts = []
        result["mounts"] = mounts
        if any(m.get("result") != "not-mounted" for m in mounts):
            result["changed"] = True
        if rc != 0:
            fail(module, result, "tmpfsctl down failed (exit %d): %s" % (rc, (err or out).strip()), stdout=out, stderr=err)
        # Nothing left for the units' ExecStop= to do: stop them before their
        # files go, so no shutdown runs `down` on a spec that is gone.
        if p["boot"] == "systemd" and systemd_running(module):
            active = [u for u in BOOT_UNITS if systemctl(module, "is-active", "--quiet", u)[0] == 0]
            if active:
                systemctl(module, "stop", *active)
                result["changed"] = True
    if p["boot"] != "none":
        rc, out, err = runner.run(["boot", "remove", "--format", "json"], what="boot remove")
        try:
            report = json.loads(out)
        except ValueError:
            report = {"output": out}
        result["boot"] = report
        if report.get("changed"):
            result["changed"] = True
            if systemd_running(module):
                systemctl(module, "daemon-reload")
    if exists:
        os.unlink(path)
        fsync_dir(os.path.dirname(path) or "/")
        result["changed"] = True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/tmpfsctl/cache.yaml"),
            spec=dict(type="dict"),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            boot=dict(type="str", default="systemd", choices=["systemd", "fstab", "sysv", "none"]),
            agent=dict(type="bool"),
            fail_on_degraded=dict(type="bool", default=False),
            binary=dict(type="str", default="tmpfsctl"),
            state_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    binary = p["binary"]
    if os.sep not in binary:
        binary = module.get_bin_path(binary, required=True)
    elif not os.access(binary, os.X_OK):
        module.fail_json(msg="%s is not an executable" % binary)
    p["path"] = os.path.abspath(p["path"])

    result = dict(changed=False, rc=0, agent=False, degraded=[], refused=[], mounts=[], spec_changed=False,
                  msg="", stdout="", stderr="", diff=[])
    runner = Runner(module, binary, p["state_dir"])
    try:
        if p["state"] == "present":
            spec_data = present(module, runner, result)
            if not module.check_mode:
                boot_install(module, runner, result)
            ensure_agent(module, result, spec_data)
        else:
            absent(module, runner, result)
    except (IOError, OSError) as e:
        fail(module, result, "tmpfsctl.offload.spec: %s" % to_native(e))

    dummy, out, err = runner.last
    result["stdout"] = out
    result["stderr"] = err
    if result["degraded"] or result["refused"]:
        result["msg"] = "not fully converged: degraded %s, refused %s" % (result["degraded"], result["refused"])
    else:
        result["msg"] = "changed" if result["changed"] else "converged, nothing to do"
    if not module._diff:
        result.pop("diff")
    # rc 3 (degraded, not fail_on_degraded) is a warning: say `failed: false`
    # explicitly, or Ansible takes any non-zero rc for a failure.
    module.exit_json(failed=False, **result)


if __name__ == "__main__":
    main()
