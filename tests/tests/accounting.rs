//! Exact accounting under overload: every matched drop is emitted, lost or
//! sampled out, and the matched count equals counts kdrop does not keep (the
//! flood's own and the dropping iptables rule's).
use std::time::Duration;

use integration_tests::{Kdrop, Pair};

/// A flood far faster than a 4 KiB ring (about 46 records) can be drained:
/// events must be lost, and every one of them counted.
#[test]
fn tiny_ring_loses_events_and_counts_every_one() {
    let p = Pair::new("acct", 61);
    p.drop_syns_to(5611);
    let k = Kdrop::start(&[
        "--json",
        "--netns",
        &p.server.name,
        "--port",
        "5611",
        "--ring-size",
        "4",
    ]);
    let before = p.dropped();
    let sent = p.flood(5611, 200_000, Duration::from_secs(3));
    let dropped = p.dropped() - before;
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    let c = done.counts();
    // The rule's counter is the independent count. A packet can only miss
    // it by overflowing the node's backlog before IP (then no TCP header is
    // in place, and kdrop does not match it either).
    assert_eq!(c.matched, dropped, "{c:?} vs {dropped} dropped of {sent:?}");
    assert!(
        dropped <= sent.packets && dropped > 0,
        "{dropped} vs {sent:?}"
    );
    assert_eq!(c.matched, c.emitted + c.lost + c.sampled_out, "{c:?}");
    assert_eq!(c.sampled_out, 0, "{c:?}");
    assert!(c.lost > 0, "a 4 KiB ring kept up with {sent:?}: {c:?}");
    // Everything emitted reached userspace and was printed.
    assert_eq!(c.received, c.emitted, "{c:?}");
    assert_eq!(done.records().len() as u64, c.received);
}

/// `--sample N` emits the 1st, N+1th, ... match on each CPU: with C CPUs,
/// matched/N <= emitted + lost < matched/N + C.
#[test]
fn sampling_emits_one_in_n_and_counts_the_rest() {
    let p = Pair::new("sample", 62);
    p.drop_syns_to(5612);
    let k = Kdrop::start(&[
        "--json",
        "--netns",
        &p.server.name,
        "--port",
        "5612",
        "--sample",
        "10",
    ]);
    let sent = p.flood(5612, 20_000, Duration::from_secs(5));
    let dropped = p.dropped();
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    let c = done.counts();
    assert_eq!(c.matched, dropped, "{c:?} vs {dropped} dropped of {sent:?}");
    assert!(c.sampled_out > 0, "{c:?}");
    assert_eq!(c.matched, c.emitted + c.lost + c.sampled_out, "{c:?}");
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let kept = c.emitted + c.lost;
    assert!(
        kept * 10 >= c.matched && kept < c.matched.div_ceil(10) + cpus,
        "{c:?}"
    );
    assert!(
        done.stderr
            .iter()
            .any(|l| l.contains(&format!("sampled out {}", c.sampled_out))),
        "{:?}",
        done.stderr
    );
}
