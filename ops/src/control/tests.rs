//! The control socket's tests: JSON-RPC to the letter, callers named, sockets not reached.

use super::*;
use std::time::Instant;

#[test]
fn a_socket_not_reached_says_what_to_check() {
    let gone = std::env::temp_dir().join(format!("dxpu-no-socket-{}.sock", std::process::id()));
    let e = call(&gone, "status", Value::Null, Duration::from_secs(1)).unwrap_err().to_string();
    assert!(e.contains("no such socket") && e.contains("[control] socket"), "{e}");
    // A socket file nobody serves any more.
    let stale = std::env::temp_dir().join(format!("dxpu-stale-{}.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let e = call(&stale, "status", Value::Null, Duration::from_secs(1)).unwrap_err().to_string();
    let _ = std::fs::remove_file(&stale);
    assert!(e.contains("nothing serves it"), "{e}");
    let denied = connect_hint(&std::io::Error::from(std::io::ErrorKind::PermissionDenied));
    assert!(denied.contains("runs as uid") && denied.contains("user dxpu"), "{denied}");
}

fn err_code(v: &Option<Value>) -> Option<i64> {
    v.as_ref()?.get("error")?.get("code")?.as_i64()
}

#[test]
fn a_key_named_twice_is_refused_not_read_as_the_last() {
    let (tx, rx) = mpsc::channel::<Call>();
    let v = handle_line(br#"{"jsonrpc":"2.0","id":1,"method":"status","method":"reload"}"#, &tx, None);
    assert_eq!(err_code(&v), Some(PARSE_ERROR), "{v:?}");
    assert!(v.unwrap()["error"]["message"].as_str().unwrap().contains("\"method\" appears twice"));
    let v = handle_line(
        br#"{"jsonrpc":"2.0","id":1,"method":"detach","params":{"name":"a","name":"b"}}"#,
        &tx,
        None,
    );
    assert_eq!(err_code(&v), Some(PARSE_ERROR), "{v:?}");
    assert!(rx.try_recv().is_err(), "a call reached the endpoint");
}

/// A server that streams a line without end, and one that trickles a byte at a time:
/// `call` stops at MAX_ANSWER and at its deadline (on 9b5fbd6 it grew to 4.4 GB in 8 s,
/// and its timeout was per read).
#[test]
fn an_endless_or_trickling_answer_ends_at_its_bound_and_deadline() {
    let dir = std::env::temp_dir().join(format!("dxpu-ctl-endless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for trickle in [false, true] {
        let path = dir.join(format!("s{trickle}.sock"));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let chunk = vec![b'a'; 64 << 10];
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                let r = if trickle { s.write_all(b"a") } else { s.write_all(&chunk) };
                if r.is_err() {
                    break;
                }
                if trickle {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        let t = Instant::now();
        let e = call(&path, "status", Value::Null, Duration::from_millis(800)).unwrap_err();
        let took = t.elapsed();
        if trickle {
            assert!(matches!(e, CallError::NoAnswer { .. }), "{e}");
            assert!(took < Duration::from_millis(1500), "{took:?}");
        } else {
            assert!(matches!(e, CallError::TooLong { limit: MAX_ANSWER, .. }), "{e}");
        }
        server.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_requests_get_json_rpc_errors() {
    let (tx, rx) = mpsc::channel::<Call>();
    let t = std::thread::spawn(move || {
        while let Ok(c) = rx.recv() {
            let r = if c.method == "echo" {
                Ok(c.params.clone())
            } else {
                Err(RpcError::new(METHOD_NOT_FOUND, "no"))
            };
            c.answer(r);
        }
    });
    assert_eq!(err_code(&handle_line(b"{", &tx, None)), Some(PARSE_ERROR));
    assert_eq!(
        handle_line(b"[1]", &tx, None),
        Some(
            json!([{"jsonrpc": "2.0", "id": null, "error": {"code": INVALID_REQUEST, "message": "a request is an object"}}])
        )
    );
    assert_eq!(err_code(&handle_line(b"[]", &tx, None)), Some(INVALID_REQUEST));
    assert_eq!(err_code(&handle_line(br#"{"method":"echo","id":1}"#, &tx, None)), Some(INVALID_REQUEST));
    assert_eq!(
        err_code(&handle_line(br#"{"jsonrpc":"2.0","method":5,"id":1}"#, &tx, None)),
        Some(INVALID_REQUEST)
    );
    assert_eq!(
        err_code(&handle_line(br#"{"jsonrpc":"2.0","method":"x","id":{}}"#, &tx, None)),
        Some(INVALID_REQUEST)
    );
    assert_eq!(
        err_code(&handle_line(br#"{"jsonrpc":"2.0","method":"x","id":7}"#, &tx, None)),
        Some(METHOD_NOT_FOUND)
    );
    let ok = handle_line(br#"{"jsonrpc":"2.0","method":"echo","params":{"a":1},"id":"q"}"#, &tx, None);
    assert_eq!(ok, Some(json!({"jsonrpc": "2.0", "id": "q", "result": {"a": 1}})));
    // A notification (no id) is done and not answered (on 9b5fbd6 it got a reply).
    assert_eq!(handle_line(br#"{"jsonrpc":"2.0","method":"echo","params":[1]}"#, &tx, None), None);
    // A batch gets the answers to its requests, in order, none for its notifications
    // (on 9b5fbd6 a batch was refused).
    let b = handle_line(
        br#"[{"jsonrpc":"2.0","method":"echo","params":[1],"id":1},{"jsonrpc":"2.0","method":"echo"},{"jsonrpc":"2.0","method":"x","id":2}]"#,
        &tx,
        None,
    );
    let b = b.unwrap();
    assert_eq!(b.as_array().map(Vec::len), Some(2), "{b}");
    assert_eq!(b[0]["result"], json!([1]));
    assert_eq!(b[1]["error"]["code"], METHOD_NOT_FOUND);
    assert_eq!(handle_line(br#"[{"jsonrpc":"2.0","method":"echo"}]"#, &tx, None), None, "all notifications");
    drop(tx);
    t.join().unwrap();
}

/// A batch past [`MAX_BATCH`] is refused whole, and a batch whose answers pass
/// [`MAX_LINE_ANSWER`] is answered with errors for the rest: what 15 clients' batches of a
/// megabyte of `stats` requests held at once on 166c20c (1.62 GB) is bounded.
#[test]
fn a_batch_past_its_bounds_is_refused_or_cut_short() {
    let (tx, rx) = mpsc::channel::<Call>();
    let t = std::thread::spawn(move || {
        while let Ok(c) = rx.recv() {
            // An answer of 1 MiB, as a box's `stats` of many devices might be.
            c.answer(Ok(json!("s".repeat(1 << 20))));
        }
    });
    let req = |i: usize| format!(r#"{{"jsonrpc":"2.0","method":"stats","id":{i}}}"#);
    let batch = |n: usize| format!("[{}]", (0..n).map(req).collect::<Vec<_>>().join(","));
    let e = handle_line(batch(MAX_BATCH + 1).as_bytes(), &tx, None);
    assert_eq!(err_code(&e), Some(INVALID_REQUEST));
    assert!(e.unwrap()["error"]["message"].as_str().unwrap().contains("at most 32"));
    let b = handle_line(batch(MAX_BATCH).as_bytes(), &tx, None).unwrap();
    let answers = b.as_array().unwrap();
    assert_eq!(answers.len(), MAX_BATCH, "every request answered");
    let run = answers.iter().filter(|a| a.get("result").is_some()).count();
    assert_eq!(run, 4, "four MiB of answers, then errors");
    assert_eq!(answers[MAX_BATCH - 1]["id"], json!(MAX_BATCH - 1));
    assert!(answers[MAX_BATCH - 1]["error"]["message"].as_str().unwrap().contains("not run"));
    drop(tx);
    t.join().unwrap();
}

fn socket_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("dxpu-control-{what}-{}.sock", std::process::id()))
}

fn read_answer(s: &UnixStream) -> Value {
    // A server that never answers fails the test instead of hanging it.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or(Value::Null)
}

#[test]
fn a_client_streaming_without_a_newline_is_cut_off_at_the_limit() {
    let path = socket_path("long");
    let (tx, _rx) = mpsc::channel::<Call>();
    let server = ControlServer::bind(&path, tx).unwrap();
    let s = UnixStream::connect(&path).unwrap();
    // 64 MiB with no newline, without a pause: the server must stop reading after about
    // 64 KiB and answer, not take it all in (which it did while it read to a newline).
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        (0..64).try_for_each(|_| w.write_all(&chunk)).is_ok()
    });
    let v = read_answer(&s);
    assert_eq!(err_code(&Some(v.clone())), Some(INVALID_REQUEST), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("longer than"), "{v}");
    assert!(!writer.join().unwrap(), "the server read all 64 MiB of one line");
    drop(server);
}

#[test]
fn one_client_past_the_limit_is_refused_and_the_others_served() {
    let path = socket_path("many");
    let (tx, rx) = mpsc::channel::<Call>();
    let answers = std::thread::spawn(move || {
        while let Ok(c) = rx.recv() {
            c.answer(Ok(json!("pong")));
        }
    });
    let server = ControlServer::bind(&path, tx).unwrap();
    let ping = br#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let mut held = Vec::new();
    for _ in 0..MAX_CLIENTS {
        let mut s = UnixStream::connect(&path).unwrap();
        // Answered: its thread is running, so it counts before the next one connects.
        s.write_all(ping).and_then(|()| s.write_all(b"\n")).unwrap();
        assert_eq!(read_answer(&s)["result"], "pong");
        held.push(s);
    }
    let extra = UnixStream::connect(&path).unwrap();
    let v = read_answer(&extra);
    assert_eq!(err_code(&Some(v.clone())), Some(FAILED), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("too many control clients"), "{v}");
    // One goes away: a new client is served again (its thread is counted out first).
    drop(held.pop());
    let started = Instant::now();
    loop {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(ping).and_then(|()| s.write_all(b"\n")).unwrap();
        if read_answer(&s)["result"] == "pong" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "no client served after one left");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    drop(server);
    answers.join().unwrap();
}

#[test]
fn tidy_rounds_fractions_to_nine_digits_and_leaves_integers() {
    let v = json!({"a": 2.3329999999999997, "b": [0.1 + 0.2, 1.0 / 3.0], "c": u64::MAX, "d": -7, "e": 1e-12 / 3.0,
        "f": 8_412_345_678.9, "g": null, "h": "2.3329999999999997", "i": 2.5});
    let t = tidy(v);
    assert_eq!(
        t.to_string(),
        r#"{"a":2.333,"b":[0.3,0.333333333],"c":18446744073709551615,"d":-7,"e":3.33333333e-13,"f":8412345680.0,"g":null,"h":"2.3329999999999997","i":2.5}"#
    );
}
