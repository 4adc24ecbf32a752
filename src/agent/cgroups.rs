//! Labels for the cgroup v2 id the profiler records with every sample. An
//! id alone means nothing to a user; what they filter by is the cgroup
//! path and what the path encodes: the container id (and its runtime), the
//! systemd unit and the Kubernetes pod uid. All of it is read from the
//! path, so no runtime or API server needs to be asked.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Length of a container id in hex: docker, podman, containerd and cri-o
/// all name containers by a SHA-256.
const ID_LEN: usize = 64;

/// What a cgroup path says about the threads in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLabels {
    /// The path below the cgroup2 root: "/" for the root, "" if unknown.
    pub path: String,
    /// The 64-hex-digit id of the container the cgroup belongs to.
    pub container_id: Option<String>,
    /// "docker", "podman", "containerd", "cri-o", or "kubernetes" when
    /// only the kubelet's layout shows it is a container.
    pub runtime: Option<&'static str>,
    /// The systemd unit, as `systemctl status` names it.
    pub unit: Option<String>,
    /// The Kubernetes pod's uid, dashed as `kubectl get pod -o yaml` shows it.
    pub pod_uid: Option<String>,
}

impl CgroupLabels {
    /// Labels from a cgroup v2 path as in /proc/PID/cgroup's `0::PATH` line.
    pub fn from_path(path: &str) -> CgroupLabels {
        let path = clean(path);
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let (container_id, runtime) = match container(&comps) {
            Some((id, runtime)) => (Some(id.to_string()), runtime),
            None => (None, None),
        };
        CgroupLabels {
            path: path.to_string(),
            container_id,
            runtime,
            unit: unit(&comps).map(str::to_string),
            pod_uid: pod_uid(&comps),
        }
    }

    /// (name, value) pairs for a profile: cgroup, container_id,
    /// container_runtime, systemd_unit, pod_uid — only those present; path
    /// "/" is still given as cgroup="/".
    pub fn pairs(&self) -> Vec<(String, String)> {
        let fields = [
            (
                "cgroup",
                (!self.path.is_empty()).then_some(self.path.as_str()),
            ),
            ("container_id", self.container_id.as_deref()),
            ("container_runtime", self.runtime),
            ("systemd_unit", self.unit.as_deref()),
            ("pod_uid", self.pod_uid.as_deref()),
        ];
        fields
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_string(), value?.to_string())))
            .collect()
    }
}

/// The path without what a caller may have kept from /proc/PID/cgroup:
/// the line end, and the " (deleted)" the kernel appends once the cgroup
/// has been removed (a sample's thread may outlive its cgroup's directory).
fn clean(path: &str) -> &str {
    let path = path.trim_end();
    path.strip_suffix(" (deleted)").unwrap_or(path)
}

/// The container id and runtime from the last component holding an id.
/// The last, because containers nest (docker in docker) and the innermost
/// one ran the thread; components below it (libpod's `/container`) are the
/// runtime's own.
fn container<'a>(comps: &[&'a str]) -> Option<(&'a str, Option<&'static str>)> {
    for (i, comp) in comps.iter().enumerate().rev() {
        let Some((prefix, id)) = find_id(comp) else {
            continue;
        };
        let tag = prefix.strip_suffix(['-', ':']).unwrap_or(prefix);
        // conmon monitors the container from outside it: its scope carries
        // the container's id but none of the container's threads.
        if ends_with_token(tag, "conmon") {
            return None;
        }
        let runtime = if tag.is_empty() {
            // A bare id is named by its parent: docker's cgroupfs driver
            // uses /docker/<id>, the kubelet's /kubepods/<qos>/pod<uid>/<id>.
            if i > 0 && comps[i - 1] == "docker" {
                Some("docker")
            } else if comps[..i].iter().any(|c| c.contains("kubepods")) {
                Some("kubernetes")
            } else {
                None
            }
        } else {
            RUNTIMES
                .iter()
                .find(|(token, _)| ends_with_token(tag, token))
                .map(|&(_, runtime)| runtime)
        };
        return Some((id, runtime));
    }
    None
}

/// The word before a container id in a scope's name, and the runtime that
/// writes it.
const RUNTIMES: [(&str, &str); 4] = [
    ("docker", "docker"),
    ("libpod", "podman"),
    ("cri-containerd", "containerd"),
    ("crio", "cri-o"),
];

/// Where a component holds a container id: 64 lowercase hex digits that
/// are the whole component or follow a `-` or `:`, and end it or are
/// followed by a `.` (`docker-<id>.scope`, `...slice:cri-containerd:<id>`).
/// Returns the text before the id, and the id. A longer hex run is a
/// different kind of name, not an id.
fn find_id(comp: &str) -> Option<(&str, &str)> {
    let b = comp.as_bytes();
    let last_start = b.len().checked_sub(ID_LEN)?;
    (0..=last_start).rev().find_map(|start| {
        let end = start + ID_LEN;
        let starts = start == 0 || matches!(b[start - 1], b'-' | b':');
        let ends = end == b.len() || b[end] == b'.';
        let hex = b[start..end]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        // Slicing is on char boundaries: the bytes either side are ASCII.
        (starts && ends && hex).then(|| (&comp[..start], &comp[start..end]))
    })
}

/// Whether `tag` is `token` or ends with it after a separator, so that
/// "kubepods-pod1.slice:cri-containerd" is containerd but "mydocker" is
/// not docker.
fn ends_with_token(tag: &str, token: &str) -> bool {
    tag.strip_suffix(token)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with(['-', ':', '.', '/']))
}

/// The unit as systemd's cg_path_get_unit finds it: past the leading
/// slices, the next component is the unit, or no unit owns the cgroup (a
/// unit's own sub-cgroups, like `foo.service/worker`, are still that unit).
/// The user manager (`user@UID.service`) is itself a unit with units below
/// it; the one below is what the user started, so it is the better label.
fn unit<'a>(comps: &[&'a str]) -> Option<&'a str> {
    let (i, first) = first_unit(comps)?;
    if is_user_manager(first) {
        if let Some((_, inner)) = first_unit(&comps[i + 1..]) {
            return Some(inner);
        }
    }
    Some(first)
}

fn first_unit<'a>(comps: &[&'a str]) -> Option<(usize, &'a str)> {
    let i = comps.iter().position(|c| !is_slice(unescape(c)))?;
    let name = unescape(comps[i]);
    is_unit(name).then_some((i, name))
}

/// systemd prefixes `_` to unit names that would clash with the kernel's
/// cgroup file names (cg_escape); the unit's real name is without it.
fn unescape(comp: &str) -> &str {
    comp.strip_prefix('_').unwrap_or(comp)
}

fn is_slice(name: &str) -> bool {
    name.strip_suffix(".slice").is_some_and(|s| !s.is_empty())
}

/// The unit types systemd gives cgroups to, other than slices (which hold
/// units rather than being one). Sockets, mounts and swaps get one while
/// their commands run (ExecStartPre=, mount(8), swapon(8)).
const UNIT_SUFFIXES: [&str; 5] = [".service", ".scope", ".socket", ".mount", ".swap"];

/// A unit name as systemd allows it (unit_name_is_valid, in short): so a
/// directory someone made by hand, like "my app.service", is no unit.
fn is_unit(name: &str) -> bool {
    name.len() <= 255
        && UNIT_SUFFIXES
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|stem| !stem.is_empty()))
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b":-_.\\@".contains(&c))
        && name.matches('@').count() <= 1
}

fn is_user_manager(name: &str) -> bool {
    name.strip_prefix("user@")
        .and_then(|s| s.strip_suffix(".service"))
        .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|c| c.is_ascii_digit()))
}

/// The pod uid from the kubelet's layout: `pod<uid>` under a `kubepods`
/// cgroup (cgroupfs driver), or `kubepods-<qos>-pod<uid>.slice` with the
/// uid's dashes escaped as `_` (systemd driver). A component is also split
/// at `:` for the `<slice>:<prefix>:<id>` names containerd makes when the
/// two drivers are mixed (kind clusters).
fn pod_uid(comps: &[&str]) -> Option<String> {
    comps.iter().enumerate().rev().find_map(|(i, comp)| {
        comp.split(':').find_map(|part| {
            let uid = if let Some(stem) = part.strip_suffix(".slice") {
                if !stem.contains("kubepods") {
                    return None;
                }
                stem.rsplit('-').next()?.strip_prefix("pod")?
            } else {
                // Only under kubepods: elsewhere "pod1" is just a name.
                if !comps[..i].iter().any(|c| c.contains("kubepods")) {
                    return None;
                }
                part.strip_prefix("pod")?
            };
            let valid = !uid.is_empty()
                && uid
                    .bytes()
                    .all(|c| c.is_ascii_hexdigit() || c == b'-' || c == b'_');
            valid.then(|| uid.replace('_', "-"))
        })
    })
}

/// Lists every cgroup: id -> path below the cgroup2 root.
type Walker = Box<dyn FnMut() -> HashMap<u64, String> + Send>;

/// cgroup id -> labels, for a long-running process: ids of cgroups created
/// later are found by walking the tree again on a miss, at most once per
/// `refresh` interval; entries not asked for since `forget_unused(max_age)`
/// are dropped, so the table does not grow with cgroups that came and went.
pub struct CgroupNames {
    refresh: Duration,
    walk: Walker,
    last_walk: Option<Instant>,
    /// The last walk's cgroups not asked for yet: kept so that one walk
    /// serves every cgroup created since the one before, not just the id
    /// that missed.
    unasked: HashMap<u64, String>,
    known: HashMap<u64, Known>,
}

struct Known {
    labels: CgroupLabels,
    used: Instant,
}

impl CgroupNames {
    /// An empty table; the first lookup walks the cgroup2 tree.
    pub fn new(refresh: Duration) -> CgroupNames {
        CgroupNames::with_walker(refresh, Box::new(bpfscope_sys::cgroup::id_paths))
    }

    fn with_walker(refresh: Duration, walk: Walker) -> CgroupNames {
        CgroupNames {
            refresh,
            walk,
            last_walk: None,
            unasked: HashMap::new(),
            known: HashMap::new(),
        }
    }

    /// The labels of cgroup `id`; None for 0 (no cgroup recorded) and for
    /// ids no walk has found, such as a cgroup created and removed between
    /// two walks.
    pub fn labels(&mut self, id: u64) -> Option<&CgroupLabels> {
        if id == 0 {
            return None;
        }
        let now = Instant::now();
        if !self.known.contains_key(&id) {
            let path = match self.unasked.remove(&id) {
                Some(path) => path,
                None if self.may_walk(now) => {
                    self.rewalk(now);
                    self.unasked.remove(&id)?
                }
                None => return None,
            };
            let labels = CgroupLabels::from_path(&path);
            self.known.insert(id, Known { labels, used: now });
        }
        let known = self.known.get_mut(&id)?;
        known.used = now;
        Some(&known.labels)
    }

    /// Drops the labels not asked for in the last `max_age`, and the last
    /// walk's leftovers if it is that old (a later miss walks again).
    pub fn forget_unused(&mut self, max_age: Duration) {
        let now = Instant::now();
        self.known
            .retain(|_, k| now.saturating_duration_since(k.used) < max_age);
        if self
            .last_walk
            .is_some_and(|t| now.saturating_duration_since(t) >= max_age)
        {
            self.unasked = HashMap::new();
        }
    }

    /// How many cgroups' labels are held (those asked for and not forgotten).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no labels are held.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    fn may_walk(&self, now: Instant) -> bool {
        self.last_walk
            .is_none_or(|t| now.saturating_duration_since(t) >= self.refresh)
    }

    fn rewalk(&mut self, now: Instant) {
        self.last_walk = Some(now);
        self.unasked.clear();
        for (id, path) in (self.walk)() {
            match self.known.get_mut(&id) {
                // On kernels that reuse cgroup ids, one may now be another
                // cgroup: relabel it.
                Some(k) if k.labels.path != path => k.labels = CgroupLabels::from_path(&path),
                Some(_) => {}
                None => {
                    self.unasked.insert(id, path);
                }
            }
        }
    }
}

impl fmt::Debug for CgroupNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CgroupNames")
            .field("refresh", &self.refresh)
            .field("last_walk", &self.last_walk)
            .field("known", &self.known.len())
            .field("unasked", &self.unasked.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    struct Case {
        path: String,
        container_id: Option<&'static str>,
        runtime: Option<&'static str>,
        unit: Option<String>,
        pod_uid: Option<&'static str>,
    }

    fn case(path: &str) -> Case {
        Case {
            path: path.replace("<id>", ID),
            container_id: None,
            runtime: None,
            unit: None,
            pod_uid: None,
        }
    }

    impl Case {
        fn container(mut self, runtime: Option<&'static str>) -> Case {
            self.container_id = Some(ID);
            self.runtime = runtime;
            self
        }
        fn unit(mut self, unit: &str) -> Case {
            self.unit = Some(unit.replace("<id>", ID));
            self
        }
        fn pod(mut self, uid: &'static str) -> Case {
            self.pod_uid = Some(uid);
            self
        }
    }

    #[test]
    fn labels_from_paths() {
        let cases = [
            // systemd hosts
            case("/system.slice/nginx.service").unit("nginx.service"),
            case("/system.slice/foo.service/worker").unit("foo.service"),
            case("/system.slice/system-getty.slice/getty@tty1.service").unit("getty@tty1.service"),
            case("/user.slice/user-1000.slice/session-3.scope").unit("session-3.scope"),
            case("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service")
                .unit("foo.service"),
            case("/user.slice/user-1000.slice/user@1000.service/init.scope").unit("init.scope"),
            case("/user.slice/user-1000.slice/user@1000.service/app.slice")
                .unit("user@1000.service"),
            case("/user.slice/user-1000.slice/user@1000.service").unit("user@1000.service"),
            case("/init.scope").unit("init.scope"),
            case("/system.slice/dev-hugepages.mount").unit("dev-hugepages.mount"),
            case("/system.slice/_cpu.service").unit("cpu.service"),
            // Not units: slices only, no unit after the slices, bad names.
            case("/system.slice"),
            case("/user.slice/user-1000.slice"),
            case("/foo/bar.service"),
            case("/system.slice/my app.service"),
            case("/system.slice/.service"),
            // docker
            case("/system.slice/docker-<id>.scope")
                .container(Some("docker"))
                .unit("docker-<id>.scope"),
            case("/docker/<id>").container(Some("docker")),
            case("/docker/<id>/init.scope").container(Some("docker")),
            // podman, rootful and rootless, and its conmon
            case("/machine.slice/libpod-<id>.scope")
                .container(Some("podman"))
                .unit("libpod-<id>.scope"),
            case("/machine.slice/libpod-<id>.scope/container")
                .container(Some("podman"))
                .unit("libpod-<id>.scope"),
            case("/machine.slice/libpod-conmon-<id>.scope").unit("libpod-conmon-<id>.scope"),
            case("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-<id>.scope")
                .container(Some("podman"))
                .unit("libpod-<id>.scope"),
            // Kubernetes: systemd and cgroupfs drivers, containerd and cri-o
            case(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678_abcd.slice/cri-containerd-<id>.scope",
            )
            .container(Some("containerd"))
            .unit("cri-containerd-<id>.scope")
            .pod("1234-5678-abcd"),
            case("/kubepods/burstable/pod1234-5678/<id>")
                .container(Some("kubernetes"))
                .pod("1234-5678"),
            case("/kubepods/pod1234-5678/<id>")
                .container(Some("kubernetes"))
                .pod("1234-5678"),
            case(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab12_cd34.slice/crio-<id>.scope",
            )
            .container(Some("cri-o"))
            .unit("crio-<id>.scope")
            .pod("ab12-cd34"),
            case(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab12_cd34.slice/crio-conmon-<id>.scope",
            )
            .unit("crio-conmon-<id>.scope")
            .pod("ab12-cd34"),
            case("/kubepods.slice/kubepods-podab12_cd34.slice/crio-<id>.scope/container")
                .container(Some("cri-o"))
                .unit("crio-<id>.scope")
                .pod("ab12-cd34"),
            case("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab12_cd34.slice")
                .pod("ab12-cd34"),
            // kind: containerd's slice:prefix:id names under its own service
            case(
                "/system.slice/containerd.service/kubepods-burstable-podab12_cd34.slice:cri-containerd:<id>",
            )
            .container(Some("containerd"))
            .unit("containerd.service")
            .pod("ab12-cd34"),
            // Unknown runtime: the id is still the id.
            case("/lxc.payload.c1/foo-<id>").container(None),
            case("/<id>").container(None),
            // Near misses: not an id, or not a pod.
            case("/system.slice/docker-<id>x.scope").unit("docker-<id>x.scope"),
            case("/docker/a<id>"),
            case("/docker/0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF"),
            case("/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"),
            case("/pod1234"),
            case("/kubepods/podman"),
            case("/system.slice/system-pod12.slice/x.service").unit("x.service"),
            // The root, and nothing
            case("/"),
            case(""),
        ];
        for c in cases {
            let got = CgroupLabels::from_path(&c.path);
            let want = CgroupLabels {
                path: c.path.clone(),
                container_id: c.container_id.map(str::to_string),
                runtime: c.runtime,
                unit: c.unit,
                pod_uid: c.pod_uid.map(str::to_string),
            };
            assert_eq!(got, want, "{}", c.path);
        }
    }

    #[test]
    fn proc_line_leftovers_are_dropped() {
        let path = format!("/system.slice/docker-{ID}.scope");
        for raw in [
            format!("{path}\n"),
            format!("{path} (deleted)"),
            format!("{path} (deleted)\n"),
        ] {
            let got = CgroupLabels::from_path(&raw);
            assert_eq!(got.path, path, "{raw:?}");
            assert_eq!(got.container_id.as_deref(), Some(ID), "{raw:?}");
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|&(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pairs_give_what_is_present() {
        assert_eq!(
            CgroupLabels::from_path("/").pairs(),
            pairs(&[("cgroup", "/")])
        );
        assert_eq!(CgroupLabels::from_path("").pairs(), pairs(&[]));
        assert_eq!(
            CgroupLabels::from_path("/system.slice/nginx.service").pairs(),
            pairs(&[
                ("cgroup", "/system.slice/nginx.service"),
                ("systemd_unit", "nginx.service"),
            ])
        );
        let path =
            format!("/kubepods.slice/kubepods-pod12_ab.slice/cri-containerd-{ID}.scope/container");
        assert_eq!(
            CgroupLabels::from_path(&path).pairs(),
            pairs(&[
                ("cgroup", &path),
                ("container_id", ID),
                ("container_runtime", "containerd"),
                ("systemd_unit", &format!("cri-containerd-{ID}.scope")),
                ("pod_uid", "12-ab"),
            ])
        );
    }

    /// A cgroup tree the test changes, and how often it was walked.
    #[derive(Clone, Default)]
    struct FakeTree {
        paths: Arc<Mutex<HashMap<u64, String>>>,
        walks: Arc<AtomicUsize>,
    }

    impl FakeTree {
        fn add(&self, id: u64, path: &str) {
            self.paths.lock().unwrap().insert(id, path.to_string());
        }
        fn walks(&self) -> usize {
            self.walks.load(Ordering::SeqCst)
        }
        fn names(&self, refresh: Duration) -> CgroupNames {
            let tree = self.clone();
            CgroupNames::with_walker(
                refresh,
                Box::new(move || {
                    tree.walks.fetch_add(1, Ordering::SeqCst);
                    tree.paths.lock().unwrap().clone()
                }),
            )
        }
    }

    fn unit_of(names: &mut CgroupNames, id: u64) -> Option<String> {
        names.labels(id).and_then(|l| l.unit.clone())
    }

    #[test]
    fn one_walk_serves_many_and_misses_wait_for_refresh() {
        let tree = FakeTree::default();
        tree.add(1, "/");
        tree.add(2, "/system.slice/nginx.service");
        tree.add(3, "/system.slice/sshd.service");
        let mut names = tree.names(Duration::from_secs(3600));
        assert_eq!(tree.walks(), 0, "walks on demand only");
        assert_eq!(names.labels(0), None);
        assert_eq!(unit_of(&mut names, 2).as_deref(), Some("nginx.service"));
        assert_eq!(unit_of(&mut names, 3).as_deref(), Some("sshd.service"));
        assert_eq!(names.labels(1).map(|l| l.path.as_str()), Some("/"));
        assert_eq!(tree.walks(), 1);
        assert_eq!(names.len(), 3);
        // Created after the walk: not found until the interval has passed.
        tree.add(4, "/system.slice/cron.service");
        assert_eq!(names.labels(4), None);
        assert_eq!(names.labels(99), None);
        assert_eq!(tree.walks(), 1);
        assert_eq!(names.labels(0), None);
        assert_eq!(tree.walks(), 1, "id 0 never walks");
        assert!(format!("{names:?}").contains("known: 3"));
    }

    #[test]
    fn misses_walk_again_after_refresh() {
        let tree = FakeTree::default();
        tree.add(2, "/system.slice/nginx.service");
        let mut names = tree.names(Duration::ZERO);
        assert!(names.labels(2).is_some());
        tree.add(4, "/system.slice/cron.service");
        assert_eq!(unit_of(&mut names, 4).as_deref(), Some("cron.service"));
        assert_eq!(tree.walks(), 2);
        // Hits do not walk.
        assert!(names.labels(2).is_some());
        assert_eq!(tree.walks(), 2);
        assert_eq!(names.labels(99), None);
        assert_eq!(tree.walks(), 3);
        // A walk relabels an id that now names another cgroup.
        tree.add(2, "/system.slice/httpd.service");
        assert_eq!(names.labels(98), None);
        assert_eq!(unit_of(&mut names, 2).as_deref(), Some("httpd.service"));
    }

    #[test]
    fn unused_entries_are_forgotten() {
        let tree = FakeTree::default();
        tree.add(2, "/system.slice/nginx.service");
        tree.add(3, "/system.slice/sshd.service");
        let mut names = tree.names(Duration::ZERO);
        assert!(names.labels(2).is_some());
        assert!(names.labels(3).is_some());
        names.forget_unused(Duration::from_secs(3600));
        assert_eq!(names.len(), 2);
        names.forget_unused(Duration::ZERO);
        assert_eq!(names.len(), 0);
        assert!(names.is_empty());
        // Gone from the tree and forgotten: no longer known.
        tree.paths.lock().unwrap().remove(&3);
        assert_eq!(names.labels(3), None);
        // Still in the tree: found again by a walk.
        assert_eq!(unit_of(&mut names, 2).as_deref(), Some("nginx.service"));
        assert_eq!(names.len(), 1);
    }

    /// Removes the directories made by a test, deepest first, however the
    /// test ends.
    struct RemoveDirs(Vec<PathBuf>);

    impl Drop for RemoveDirs {
        fn drop(&mut self) {
            for dir in self.0.iter().rev() {
                if let Err(e) = fs::remove_dir(dir) {
                    eprintln!("cannot remove {}: {e}", dir.display());
                }
            }
        }
    }

    #[test]
    fn finds_a_cgroup_created_later_on_this_machine() {
        // Root by the effective uid (Uid: real effective saved fs), without libc.
        let euid = bpfscope_sys::procfs::status_field("self", "Uid")
            .and_then(|v| v.split_whitespace().nth(1).map(str::to_string));
        if euid.as_deref() != Some("0") {
            eprintln!("SKIP: not root, cannot create cgroups");
            return;
        }
        let Some(root) = bpfscope_sys::cgroup::cgroup2_root() else {
            eprintln!("SKIP: no cgroup2 mount");
            return;
        };
        let scope = format!("docker-{}.scope", "a".repeat(64));
        let mut names = CgroupNames::new(Duration::ZERO);
        // A first lookup walks the tree before the cgroup exists.
        let root_id = fs::metadata(&root).unwrap().ino();
        assert_eq!(names.labels(root_id).map(|l| l.path.as_str()), Some("/"));

        let mut made = RemoveDirs(Vec::new());
        let mut dir = root.clone();
        for comp in ["system.slice", scope.as_str()] {
            dir.push(comp);
            if !dir.is_dir() {
                fs::create_dir(&dir).unwrap();
                made.0.push(dir.clone());
            }
        }
        let id = fs::metadata(&dir).unwrap().ino();
        let labels = names.labels(id).cloned();
        let want = CgroupLabels {
            path: format!("/system.slice/{scope}"),
            container_id: Some("a".repeat(64)),
            runtime: Some("docker"),
            unit: Some(scope.clone()),
            pod_uid: None,
        };
        assert_eq!(labels, Some(want));
    }
}
