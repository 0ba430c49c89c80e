//! The traffic listener out of file descriptors (EMFILE): accept errors are counted, accepting
//! pauses (no busy loop), and once descriptors are free again the waiting client is served.
//! Alone in its test binary: it lowers the whole process's RLIMIT_NOFILE.

mod common;

use common::*;
use std::time::Duration;

fn metric(gw: &kvgate_gateway::Gateway, series: &str) -> f64 {
    let text = gw.shared().metrics_text().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

fn set_nofile(lim: libc::rlimit) {
    // SAFETY: setrlimit reads the struct it is given.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

/// The soft limit that leaves `free` descriptor numbers unused in this process (new
/// descriptors take the lowest free number, which must be below the limit; some open ones may
/// be numbered high, like an inherited jobserver's).
fn limit_leaving(free: u64) -> u64 {
    let open: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut left = free;
    let mut limit = 0;
    while left > 0 {
        if !open.contains(&limit) {
            left -= 1;
        }
        limit += 1;
    }
    limit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_accept_errors_are_counted_and_paused_and_service_resumes() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 1,
    })
    .await;
    let gw = gateway(&[&pod]).await;
    // A pooled connection to the pod exists before the limit falls (the first scrape).
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("warm", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    let saved = nofile();
    // Room for a few more descriptors only.
    set_nofile(libc::rlimit {
        rlim_cur: limit_leaving(8),
        rlim_max: saved.rlim_max,
    });
    // Clients connect (a descriptor each, and one each on the gateway's side once accepted)
    // until the gateway's accept fails.
    let mut clients = Vec::new();
    let mut spare = Some(std::fs::File::open("/dev/null").unwrap());
    for _ in 0..64 {
        if metric(&gw, "kvgate_accept_errors_total") > 0.0 {
            break;
        }
        match tokio::net::TcpStream::connect(gw.traffic_addr).await {
            Ok(s) => clients.push(s),
            // This process took the last descriptor first: give one back for the next client.
            Err(_) => drop(spare.take()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = metric(&gw, "kvgate_accept_errors_total");
    assert!(
        first > 0.0,
        "no accept error with {} clients",
        clients.len()
    );
    // The pending connection stays in the backlog and accept keeps failing, but paused:
    // 5 ms doubling, so a handful of errors in 600 ms, not a busy loop's thousands.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let errors = metric(&gw, "kvgate_accept_errors_total") - first;
    assert!(errors <= 12.0, "{errors} accept errors in 600 ms");
    set_nofile(saved);
    drop(clients);
    drop(spare);
    // Descriptors are back: within the longest pause (1 s) the listener accepts again.
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        send(
            &client(),
            post(&gw, "/v1/chat/completions", &chat_body("after", false)),
        ),
    )
    .await
    .expect("served once descriptors are free");
    assert_eq!(r.status, http::StatusCode::OK);
}
