//! deploy/kubernetes/ against trainbpf itself: the DaemonSet's command line
//! must parse with the recorder's own CLI, the kustomization must name
//! every manifest, and the port, paths and capabilities must agree across
//! the files. The schemas are checked apart, offline, by
//! `kubernetes-validate` (`cargo xtask manifests`, part of `cargo xtask
//! test`).

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use clap::Parser;
use serde_json::Value;
use trainbpf::cli::{Cli, Command};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn text(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&text(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap_or_else(|| panic!("{s}")).to_string())
        .collect()
}

fn daemonset() -> Value {
    yaml(&dir().join("daemonset.yaml"))
}

fn container(ds: &Value) -> &Value {
    let cs = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(cs.len(), 1, "one container, the recorder");
    &cs[0]
}

/// A pod IP and a node name, standing in for the downward API's.
const POD_IP: &str = "10.244.1.7";
const NODE_NAME: &str = "gpu-node-3";

/// The container's downward-API variables: name → the field it reads.
fn env_fields(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let field = e["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .unwrap_or_else(|| panic!("not from the downward API: {e}"));
            (e["name"].as_str().unwrap().to_string(), field.to_string())
        })
        .collect()
}

/// The container's command and arguments, as the kubelet passes them:
/// each `$(VAR)` replaced by its value (the stand-ins above). The kubelet
/// leaves a `$(VAR)` it has no variable for as it is, so every one must
/// be defined.
fn argv(c: &Value) -> Vec<String> {
    let mut v = strs(&c["command"]);
    v.extend(strs(&c["args"]));
    for (name, field) in env_fields(c) {
        let value = match field.as_str() {
            "status.podIP" => POD_IP,
            "spec.nodeName" => NODE_NAME,
            f => panic!("no stand-in for {f}"),
        };
        for a in &mut v {
            *a = a.replace(&format!("$({name})"), value);
        }
    }
    assert!(v.iter().all(|a| !a.contains("$(")), "undefined: {v:?}");
    v
}

fn metrics_addr(argv: &[String]) -> &str {
    let i = argv.iter().position(|a| a == "--metrics").unwrap();
    &argv[i + 1]
}

fn metrics_port(argv: &[String]) -> u16 {
    metrics_addr(argv)
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap()
}

#[test]
fn the_daemonsets_command_line_parses_with_record() {
    let ds = daemonset();
    let c = container(&ds);
    let argv = argv(c);
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}:\n{e}"));
    let Command::Record(args) = cli.command else {
        panic!("not `record`: {argv:?}");
    };
    let (job, outputs) = (&args.job, &args.outputs);
    assert!(job.all && job.cmd.is_empty() && outputs.quiet);
    // The node's name, not the pod's, in `{host}` and the recording.
    assert_eq!(outputs.hostname.as_deref(), Some(NODE_NAME));
    assert!(
        args.history.max_size > 0,
        "a node's recorder runs for days: bounded"
    );
    let output = &outputs.output;
    let out = output.to_str().unwrap();
    assert!(out.contains("{host}"), "one file per node: {out}");
    // Written into the hostPath volume, or lost with the pod.
    let mounts = c["volumeMounts"].as_array().unwrap();
    let m = mounts
        .iter()
        .find(|m| m["name"] == "recordings")
        .expect("a recordings mount");
    let mount_path = m["mountPath"].as_str().unwrap();
    assert_eq!(output.parent().unwrap(), Path::new(mount_path));
    assert_ne!(m["readOnly"], true);
    let vol = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "recordings")
        .unwrap();
    assert!(vol["hostPath"]["path"].is_string(), "{vol}");
}

#[test]
fn the_kustomization_names_every_manifest() {
    let root = dir();
    let k = yaml(&root.join("kustomization.yaml"));
    let listed: BTreeSet<String> = strs(&k["resources"]).into_iter().collect();
    let on_disk: BTreeSet<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
    // One namespace for all, the one namespace.yaml creates.
    let ns = k["namespace"].as_str().unwrap();
    for f in &on_disk {
        let m = yaml(&root.join(f));
        let meta = &m["metadata"];
        match m["kind"].as_str().unwrap() {
            "Namespace" => assert_eq!(meta["name"], ns),
            kind => assert_eq!(meta["namespace"], ns, "{kind} in {f}"),
        }
    }
}

#[test]
fn metrics_port_and_path_agree_everywhere() {
    let ds = daemonset();
    let c = container(&ds);
    let port = metrics_port(&argv(c));
    let ports = c["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "metrics");
    assert_eq!(ports[0]["containerPort"], port);
    let svc = yaml(&dir().join("service.yaml"));
    assert_eq!(svc["spec"]["ports"][0]["port"], port);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    let pod = &ds["spec"]["template"];
    for annotations in [
        &pod["metadata"]["annotations"],
        &svc["metadata"]["annotations"],
    ] {
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert_eq!(annotations["prometheus.io/port"], port.to_string());
        assert_eq!(annotations["prometheus.io/path"], "/metrics");
    }
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/metrics", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    // The Service's endpoints are the recorder's pods.
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "selector {k}");
    }
}

// The DaemonSet served every tenant's process names on every node address.
/// /metrics on the pod's own IP, in the pod's own network namespace, where
/// the shipped NetworkPolicy applies: it selects the recorder's pods, lets
/// in one namespace on the metrics port alone, and lets nothing out.
#[test]
fn metrics_are_served_on_the_pod_ip_behind_a_network_policy() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    assert_ne!(
        spec["hostNetwork"], true,
        "on the node's network, /metrics answers on every node address and no NetworkPolicy applies"
    );
    let c = container(&ds);
    let argv = argv(c);
    assert_eq!(metrics_addr(&argv), format!("{POD_IP}:9478"));
    assert!(
        env_fields(c).contains(&("POD_IP".into(), "status.podIP".into())),
        "{:?}",
        env_fields(c)
    );

    let np = yaml(&dir().join("networkpolicy.yaml"));
    assert_eq!(np["kind"], "NetworkPolicy");
    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    let selector = np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("a pod selector by labels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "selector {k}: not the recorder's pods"
        );
    }
    assert_eq!(strs(&np["spec"]["policyTypes"]), ["Ingress", "Egress"]);
    assert_eq!(np["spec"]["egress"], serde_json::json!([]), "nothing out");
    let ingress = np["spec"]["ingress"].as_array().unwrap();
    assert!(!ingress.is_empty());
    for rule in ingress {
        let from = rule["from"].as_array().expect("a rule names its peers");
        assert!(!from.is_empty(), "a rule without peers lets in anyone");
        for peer in from {
            assert!(
                peer["ipBlock"].is_null(),
                "by namespace, not address: {peer}"
            );
            let ns = peer["namespaceSelector"]["matchLabels"].as_object();
            assert!(ns.is_some_and(|m| !m.is_empty()), "{peer}");
        }
        let ports = rule["ports"].as_array().expect("a rule names its ports");
        assert_eq!(ports.len(), 1, "{rule}");
        assert_eq!(ports[0]["port"], "metrics", "{rule}");
    }
}

/// Only the capabilities record needs, each with a comment that says why.
#[test]
fn capabilities_are_few_and_each_explained() {
    let ds = daemonset();
    let sc = &container(&ds)["securityContext"];
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"]);
    let add = strs(&sc["capabilities"]["add"]);
    assert_eq!(
        add,
        [
            "BPF",
            "PERFMON",
            "SYS_RESOURCE",
            "SYS_PTRACE",
            "DAC_READ_SEARCH"
        ]
    );
    assert_ne!(sc["privileged"], true);
    let raw = text(&dir().join("daemonset.yaml"));
    for cap in &add {
        assert!(raw.contains(&format!("# - {cap}: ")), "no why for {cap}");
    }
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true);
    // The kernel interfaces, each from the node at its own path.
    let c = container(&ds);
    for path in ["/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup"] {
        let m = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("no mount at {path}"));
        let v = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        assert_eq!(v["hostPath"]["path"], path);
        assert_eq!(m["readOnly"], true, "{path}");
    }
}

/// Applies an RFC 6902 patch of `replace` operations (all the overlay
/// uses); each path must already exist.
fn apply_replaces(doc: &mut Value, patch: &Value) {
    for op in patch.as_array().unwrap() {
        assert_eq!(op["op"], "replace", "{op}");
        let path = op["path"].as_str().unwrap();
        let at = doc
            .pointer_mut(path)
            .unwrap_or_else(|| panic!("the patch's {path} is not in the DaemonSet"));
        *at = op["value"].clone();
    }
}

#[test]
fn the_sys_admin_overlay_patches_what_exists() {
    let root = dir().join("sys-admin");
    let k = yaml(&root.join("kustomization.yaml"));
    assert_eq!(strs(&k["resources"]), [".."]);
    let patch = &k["patches"][0];
    assert_eq!(patch["target"]["kind"], "DaemonSet");
    assert_eq!(patch["target"]["name"], daemonset()["metadata"]["name"]);
    let mut ds = daemonset();
    apply_replaces(&mut ds, &yaml(&root.join(patch["path"].as_str().unwrap())));
    let sc = &container(&ds)["securityContext"];
    let add = strs(&sc["capabilities"]["add"]);
    assert!(add.contains(&"SYS_ADMIN".to_string()), "{add:?}");
    assert!(!add.contains(&"BPF".to_string()) && !add.contains(&"PERFMON".to_string()));
    // The API server refuses SYS_ADMIN with allowPrivilegeEscalation false.
    assert_eq!(sc["allowPrivilegeEscalation"], true);
}
