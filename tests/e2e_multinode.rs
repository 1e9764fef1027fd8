//! End to end on a lab that behaves like a Kubernetes cluster of three
//! nodes (`common::multinode`): an external client on the nodes' segment,
//! two pods behind each node's `cni0`, routes between the pod CIDRs as a
//! CNI installs them, and the real `rivorad -kubernetes` on every node
//! against the shared API server. The client sends the VIP traffic to one
//! "receiving" node and has no route to any pod: a pod that answers with
//! its own address is a failure the client sees.
//!
//! What it proves:
//! - the lab is what the other tests assume, without any rivorad: every
//!   pod answers its own node and the other nodes over the pod-CIDR routes
//!   (and other pods), the client reaches every node's `eth0`, and the
//!   client reaches no pod address: it has no route
//!   (`lab_routes_pods_between_nodes_and_hides_them_from_the_client`);
//! - with the defaults (no ServicePolicy, externalTrafficPolicy Cluster), a
//!   LoadBalancer Service whose endpoints are spread over every node is
//!   answered by a pod for every TCP connection and UDP request, IPv4 and
//!   IPv6, whichever node the pod runs on
//!   (`default_mode_reaches_pods_on_every_node`). NAT alone cannot do it:
//!   a pod on another node than the receiving one replies from its own
//!   address straight to the client, past the receiving node's
//!   translation; this test fails until the receiving node also rewrites
//!   the source (full NAT), and its output names the pods whose replies
//!   came back untranslated.
//!
//! Needs root, the API server (`make apiserver`) and rivoractl built
//! (`cargo build --workspace --bins`).

mod common;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Command;

use common::multinode::{Cluster, Exchanges, MultiNode, POD_PORT, STEP};
use common::traffic::{canonical, tcp_once, udp_once, Proto};
use serde_json::json;

/// TCP connections per family.
const TCP_FLOWS: usize = 300;
/// UDP requests per family.
const UDP_FLOWS: usize = 60;
/// Each of six pods takes at least this many of `TCP_FLOWS`: with a fair
/// 1-in-6 split a count is Binomial(300, 1/6), mean 50, standard deviation
/// 6.5; 20 is 4.6 deviations under the mean (P = 2e-6 per check).
const MIN_PER_POD: usize = 20;

/// The lab's namespaces, by name.
fn namespaces(lab: &MultiNode) -> Vec<String> {
    let mut v = vec![lab.switch.name.clone(), lab.client.name.clone()];
    for n in &lab.nodes {
        v.push(n.ns.name.clone());
        v.extend(n.pods.iter().map(|p| p.ns.name.clone()));
    }
    v
}

fn netns_list() -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("running ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn lab_routes_pods_between_nodes_and_hides_them_from_the_client() {
    common::require::root_and_tools("e2e_multinode");
    let lab = MultiNode::builder().build();
    assert_eq!(lab.nodes.len(), 3);
    assert_eq!(lab.pods().count(), 6);
    let first = lab.pod("n1-p1");
    for v6 in [false, true] {
        for pod in lab.pods() {
            let to = pod.target(v6);
            // Its own node reaches it on cni0, the others over their eth0
            // and the pod-CIDR routes, and so does a pod of node 1.
            let froms = lab
                .nodes
                .iter()
                .map(|n| {
                    let src = if n.number == pod.node_number {
                        if v6 {
                            IpAddr::from(n.cni0_v6)
                        } else {
                            n.cni0_v4.into()
                        }
                    } else {
                        n.eth0(v6)
                    };
                    (&n.ns, n.name.as_str(), src)
                })
                .chain([(&first.ns, first.name.as_str(), first.addr(v6))]);
            for (ns, from, src) in froms {
                for proto in [Proto::Tcp, Proto::Udp] {
                    let hit = ns
                        .run(move || match proto {
                            Proto::Tcp => tcp_once(to, STEP),
                            Proto::Udp => udp_once(to, "ping", STEP),
                        })
                        .unwrap_or_else(|e| panic!("{proto:?} from {from} to {to}: {e}"));
                    assert_eq!(hit.backend, pod.name, "{proto:?} from {from} to {to}");
                    assert_eq!(
                        hit.peer.ip(),
                        src,
                        "{proto:?} from {from} to {to}: the pod saw {}",
                        hit.peer
                    );
                    assert_eq!(hit.peer, canonical(hit.me), "{proto:?} from {from} to {to}");
                }
            }
        }
        for node in &lab.nodes {
            // Nothing listens there: a refusal is the node's answer.
            let to = SocketAddr::new(node.eth0(v6), POD_PORT);
            let r = lab
                .client
                .run(move || TcpStream::connect_timeout(&to, STEP));
            let e = r.expect_err("nothing listens on a node");
            assert_eq!(
                e.kind(),
                ErrorKind::ConnectionRefused,
                "client to {to} ({}): {e}",
                node.name
            );
        }
        for pod in lab.pods() {
            let to = pod.target(v6);
            let r = lab
                .client
                .run(move || TcpStream::connect_timeout(&to, STEP));
            let e = r.expect_err("the client has no route to a pod");
            assert_eq!(
                e.raw_os_error(),
                Some(libc::ENETUNREACH),
                "client to {to} ({}): {e}",
                pod.name
            );
        }
    }
    let names = namespaces(&lab);
    drop(lab);
    let left: Vec<String> = netns_list()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left after the lab: {left:?}");
}

#[test]
fn default_mode_reaches_pods_on_every_node() {
    common::require::root_and_tools("e2e_multinode");
    let lab = MultiNode::builder().nodes(3).pods_per_node(2).build();
    let c = Cluster::builder(lab).start();
    let vips = c.create_service("web", 1, json!({}));
    c.wait_programmed("web");
    let runs: Vec<Exchanges> = vips
        .iter()
        .flat_map(|&vip| [(vip, Proto::Tcp, TCP_FLOWS), (vip, Proto::Udp, UDP_FLOWS)])
        .map(|(vip, proto, n)| {
            let r = c.exchanges(vip, proto, n);
            eprintln!("{r}");
            r
        })
        .collect();
    // The runs' reports are above (a failing test's output is shown).
    let failed: usize = runs.iter().map(|r| r.failed().len()).sum();
    let total: usize = runs.iter().map(|r| r.attempts.len()).sum();
    let by_pod: Vec<String> = runs
        .iter()
        .map(|r| format!("{:?} to {}: {:?}", r.proto, r.vip, r.failed_per_pod()))
        .collect();
    assert_eq!(
        failed,
        0,
        "{failed} of {total} attempts through the VIPs went unanswered; failures by the pod \
         whose reply reached the client untranslated:\n{}",
        by_pod.join("\n")
    );
    for r in runs.iter().filter(|r| r.proto == Proto::Tcp) {
        for (pod, n) in r.per_pod() {
            assert!(
                n >= MIN_PER_POD,
                "{pod} answered {n} of {TCP_FLOWS} TCP connections to {}, below {MIN_PER_POD}:\n{r}",
                r.vip
            );
        }
    }
}
