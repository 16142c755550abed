use super::super::{Ledger, LedgerError, Location, RowHash, Window};
use super::*;
use crate::event::Event;
use crate::test_events::{event, span};
use frugal_testkit::postgres::{PASSWORD, Server, database};

fn fresh() -> (String, Ledger) {
    let url = database();
    let ledger = Ledger::open(Location::Postgres(url.clone())).unwrap();
    (url, ledger)
}

fn raw(url: &str) -> Client {
    Client::connect(url, postgres::NoTls).unwrap()
}

#[test]
fn events_and_spans_cannot_be_changed_or_removed() {
    let (url, mut ledger) = fresh();
    let span = ReplicaSpan {
        max_replicas: 2,
        ..span(1, Money::from_cents(2))
    };
    ledger
        .append_with_spans("ok", &[event(1, 1)], &[span])
        .unwrap();
    let mut client = raw(&url);
    for sql in [
        "UPDATE events SET cost = 0",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE replica_spans SET cost = 0",
        "DELETE FROM replica_spans",
        "TRUNCATE replica_spans CASCADE",
    ] {
        let err = client.batch_execute(sql).unwrap_err();
        let text = err.as_db_error().map(|d| d.message().to_owned());
        assert_eq!(text.as_deref(), Some("the ledger is append-only"), "{sql}");
    }
    assert_eq!(ledger.info().unwrap().events, 1);
}

#[test]
fn an_event_written_twice_with_its_id_is_stored_and_rolled_up_once() {
    let (_, mut ledger) = fresh();
    let mut e = event(1, 7);
    e.id = Some([9; 16]);
    assert_eq!(
        ledger.append("meter", &[e.clone(), event(2, 1)]).unwrap(),
        2
    );
    // A retried group commit: the same request again, with one new one.
    assert_eq!(ledger.append("meter", &[e, event(3, 1)]).unwrap(), 1);
    let info = ledger.info().unwrap();
    assert_eq!(info.events, 3);
    assert_eq!(info.total_cost, Money::from_cents(9));
    let mut rolled = Money::ZERO;
    ledger
        .rollups(Window::default(), |_, s| rolled += s.cost)
        .unwrap();
    assert_eq!(rolled, Money::from_cents(9));
}

#[test]
fn a_v7_database_gains_span_ids_and_a_span_written_twice_with_its_id_is_stored_once() {
    let url = database();
    raw(&url)
        .batch_execute(&format!(
            "{}\nINSERT INTO schema_version (version) VALUES (7);",
            SCHEMA_V7.replace("{ADVISED}", segments::ADVISED)
        ))
        .unwrap();
    let mut ledger = Ledger::open(Location::Postgres(url.clone())).unwrap();
    assert_eq!(ledger.info().unwrap().schema_version, SCHEMA_VERSION);
    let span = ReplicaSpan {
        id: Some([3; 16]),
        ..span(1, Money::from_cents(1))
    };
    let e = {
        let mut e = event(1, 2);
        e.id = Some([4; 16]);
        e
    };
    let spans = [span.clone()];
    assert_eq!(
        ledger
            .append_with_spans("meter", std::slice::from_ref(&e), &spans)
            .unwrap(),
        2
    );
    assert_eq!(ledger.append_with_spans("meter", &[e], &spans).unwrap(), 0);
    let mut seen = Vec::new();
    ledger
        .spans(Window::default(), |s| seen.push(s.clone()))
        .unwrap();
    assert_eq!(seen, [span]);
    let version: i64 = raw(&url)
        .query_one("SELECT version FROM schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
}

/// Issue 34: a v9 database gains the wrong-chance columns in place, keeping its events and
/// its rollup rows (the same rows and checks as SQLite's upgrade test).
#[test]
fn a_v9_database_gains_wrong_chances_and_keeps_its_rows_and_rollups() {
    use crate::ledger::testing::{V9_ROLLUP, semantic_hit, v9_rows_kept};
    let url = database();
    let mut sql = SCHEMA_V7.replace("{ADVISED}", segments::ADVISED);
    MIGRATIONS[..2].iter().for_each(|m| sql.push_str(m));
    // Ids left to the identities, as a v9 frugal's writes took them.
    sql.push_str(&format!(
        "INSERT INTO schema_version (version) VALUES (9);
         INSERT INTO dims (axis, name) VALUES (0, 'chat');
         INSERT INTO imports (at_ms, source, format) VALUES (0, 't', 'api');
         INSERT INTO events (ts_ms, duration_ms, kind, workload, instances, requests,
             input_tokens, output_tokens, cached_tokens, cost, lost_ms, import, saved, lever)
             VALUES (5, 0, 0, 1, 1, 1, 0, 0, 0, 7, 0, 1, 30, 1);
         {V9_ROLLUP}"
    ));
    raw(&url).batch_execute(&sql).unwrap();
    let mut ledger = Ledger::open(Location::Postgres(url.clone())).unwrap();
    ledger.append("t", &[semantic_hit(10, Some(0.25))]).unwrap();
    let version: i64 = raw(&url)
        .query_one("SELECT version FROM schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!((version, SCHEMA_VERSION), (11, 11));
    v9_rows_kept(&ledger);
    // v11: shadows' columns added in place.
    crate::ledger::testing::shadows_stored(&mut ledger, 4);
}

/// A batch big enough to be copied through the staging table keeps the rules of a small
/// one: a key stored before is skipped, a key twice in the batch is stored once (the
/// first), every column comes back, and a second big batch in the same write works.
#[test]
fn a_copied_batch_skips_known_keys_and_keeps_the_first_of_a_repeated_one() {
    let (_, mut ledger) = fresh();
    let key = |i: u64| {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&i.to_le_bytes());
        RowHash(k)
    };
    ledger
        .import("first.csv", "csv", |sink| {
            sink.push_row(&event(1, 1), key(3))
        })
        .unwrap();
    let mut events: Vec<Event> = (0..COPY_FROM as i64 * 2)
        .map(|i| {
            let mut e = event(100 + i, 2);
            e.capacity = Some(Capacity::Spot);
            e.utilization = Some(0.25);
            e.tenant = Some(format!("t{}", i % 3));
            e
        })
        .collect();
    events[5].cost = Money::from_cents(50);
    let mut rows: Vec<(&Event, RowHash)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (e, key(i as u64)))
        .collect();
    // Row 7 repeats row 5's key: row 5 (50 cents) is the one stored.
    rows[7].1 = key(5);
    let (stored, found) = ledger
        .import("second.csv", "csv", |sink| {
            let first = sink.push_rows(&rows)?;
            let again = sink.push_rows(&rows)?;
            Ok::<_, LedgerError>((first, again))
        })
        .unwrap();
    let (first, again) = found;
    assert_eq!(first.len(), rows.len());
    let skipped: Vec<usize> = (0..rows.len()).filter(|&i| !first[i]).collect();
    assert_eq!(skipped, vec![3, 7], "the key stored before, and the repeat");
    assert!(again.iter().all(|s| !s), "the second batch finds them all");
    assert_eq!(stored, rows.len() as u64 - 2);
    let info = ledger.info().unwrap();
    let expected = Money::from_cents(1 + 2 * (rows.len() as i64 - 3) + 50);
    assert_eq!((info.events, info.total_cost), (stored + 1, expected));
    let mut rolled = Money::ZERO;
    ledger
        .rollups(Window::default(), |_, s| rolled += s.cost)
        .unwrap();
    assert_eq!(rolled, expected);
    let mut spot = 0;
    ledger
        .scan(Window::default(), |r| {
            if r.capacity == Some(Capacity::Spot) && r.utilization == Some(0.25) {
                spot += 1;
            }
        })
        .unwrap();
    assert_eq!(spot, stored);
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let (url, mut ledger) = fresh();
    ledger.append("ok", &[event(1, 1)]).unwrap();
    drop(ledger);
    let newer = SCHEMA_VERSION + 1;
    raw(&url)
        .batch_execute(&format!("UPDATE schema_version SET version = {newer}"))
        .unwrap();
    let err = Ledger::open(Location::parse(&url))
        .err()
        .unwrap()
        .to_string();
    let want =
        format!("schema version {newer}, newer than this frugal understands ({SCHEMA_VERSION})");
    assert!(err.contains(&want), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");
    let n: i64 = raw(&url)
        .query_one("SELECT count(*) FROM events", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[test]
fn a_database_with_other_events_is_not_a_ledger() {
    let url = database();
    raw(&url)
        .batch_execute("CREATE TABLE events (x int)")
        .unwrap();
    let err = Ledger::open(Location::parse(&url))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("is not a frugal ledger"), "{err}");
}

#[test]
fn two_ledgers_opening_one_new_database_at_once_both_work() {
    let url = database();
    let opened: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| Ledger::open(Location::parse(&url)).map(|_| ())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(opened.iter().all(Result::is_ok), "{opened:?}");
}

#[test]
fn wrong_credentials_are_a_clear_error_without_the_password() {
    let server = Server::shared().unwrap();
    let url = format!(
        "postgres://postgres:not-{PASSWORD}@127.0.0.1:{}/postgres",
        server.port()
    );
    let err = Ledger::open(Location::parse(&url)).err().unwrap();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(text.contains("wrong user name or password"), "{text}");
    assert!(text.contains("127.0.0.1"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[test]
fn a_server_that_does_not_answer_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgresql://frugal:secret@127.0.0.1:{port}/ledger");
    let err = Ledger::open(Location::parse(&url))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(&format!("cannot connect to ledger postgresql://frugal:***@127.0.0.1:{port}/ledger (host 127.0.0.1:{port})")),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
}

#[test]
fn a_url_that_does_not_parse_is_a_clear_error() {
    let err = Ledger::open(Location::parse("postgres://u:pw@host:notaport/db"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("ledger URL postgres://u:***@host:notaport/db is not valid"),
        "{err}"
    );
}

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact("postgres://u:p%40ss@h:5432/db?sslmode=require"),
        "postgres://u:***@h:5432/db?sslmode=require"
    );
    assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(
        redact("postgresql://h/db?user=u&password=x"),
        "postgresql://h/db?user=u&password=***"
    );
    assert_eq!(
        Location::parse("postgres://a:b@c/d").to_string(),
        "postgres://a:***@c/d"
    );
    assert_eq!(
        Location::parse("ledger.sqlite"),
        Location::Sqlite("ledger.sqlite".into())
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// Issue 31: a password pasted unencoded (`/`, `?`, `#`, `@`, `:` and the rest) never
    /// reaches the error of a ledger that cannot be opened, nor how the location shows.
    #[test]
    fn no_password_reaches_a_connection_error(pw in frugal_testkit::secrets::url_password()) {
        let port = frugal_testkit::free_port().unwrap();
        let url = format!("postgres://frugal:{pw}@127.0.0.1:{port}/ledger?sslmode=disable");
        let location = Location::parse(&url);
        proptest::prop_assert!(location.has_credentials());
        let err = Ledger::open(location.clone()).err().unwrap();
        let mut shown = format!("{location} {location:?} {err} {err:?}");
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            shown.push_str(&s.to_string());
            source = s.source();
        }
        proptest::prop_assert!(!shown.contains(&pw), "{url}: {shown}");
    }
}

/// Two writers (as two gateways' meters) on one ledger at once, each retrying a batch the
/// way the meter does, one of them resending every batch as after a lost acknowledgement:
/// every event is stored exactly once and the rollups add up to the events.
#[test]
fn two_writers_at_once_store_every_event_exactly_once() {
    let url = database();
    Ledger::open(Location::parse(&url)).unwrap();
    const BATCHES: u64 = 40;
    const PER_BATCH: u64 = 50;
    let write = |writer: u8| {
        let mut ledger = Ledger::open(Location::parse(&url)).unwrap();
        for b in 0..BATCHES {
            let events: Vec<Event> = (0..PER_BATCH)
                .map(|i| {
                    let n = b * PER_BATCH + i;
                    // The same hours and names from both writers, and new ones in turn.
                    let mut e = event((n % 7) as i64 * 600_000, 1 + (n % 3) as i64);
                    e.model = Some(format!("m{}", n % 5));
                    e.tenant = Some(format!("t{}", (n + u64::from(writer)) % 4));
                    let mut id = [writer; 16];
                    id[..8].copy_from_slice(&n.to_le_bytes());
                    e.id = Some(id);
                    e
                })
                .collect();
            let sends = if writer == 1 { 2 } else { 1 };
            for _ in 0..sends {
                // A deadlock or a dropped connection fails the whole write; the meter
                // keeps it and writes it again.
                let mut tries = 0;
                while let Err(e) = ledger.append("meter", &events) {
                    tries += 1;
                    assert!(tries < 20, "{e}");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| write(1));
        s.spawn(|| write(2));
    });
    let ledger = Ledger::open(Location::parse(&url)).unwrap();
    let info = ledger.info().unwrap();
    assert_eq!(info.events, 2 * BATCHES * PER_BATCH);
    let mut client = raw(&url);
    let distinct: i64 = client
        .query_one("SELECT count(DISTINCT row_hash) FROM events", &[])
        .unwrap()
        .get(0);
    assert_eq!(distinct as u64, info.events);
    let (mut rolled, mut events) = (Money::ZERO, 0);
    ledger
        .rollups(Window::default(), |_, s| {
            rolled += s.cost;
            events += s.events;
        })
        .unwrap();
    assert_eq!((rolled, events as u64), (info.total_cost, info.events));
    let spend: Money = ledger
        .tenant_spend(0)
        .unwrap()
        .iter()
        .map(|(_, m)| *m)
        .sum();
    assert_eq!(spend, info.total_cost);
}

/// Two writers, each in one long transaction, add the same new names in opposite orders
/// and wait for each other in between: with names added inside the write's transaction,
/// each would wait for the other's uncommitted name (a deadlock PostgreSQL breaks by
/// failing one of them). Names go in outside it, so both writes succeed, first time.
#[test]
fn writers_adding_the_same_new_names_in_opposite_orders_do_not_deadlock() {
    let url = database();
    Ledger::open(Location::parse(&url)).unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("new-{i}")).collect();
    let halfway = std::sync::Barrier::new(2);
    let write = |reversed: bool| {
        let mut ledger = Ledger::open(Location::parse(&url)).unwrap();
        let mut order: Vec<&String> = names.iter().collect();
        if reversed {
            order.reverse();
        }
        ledger.import("meter", "api", |sink| {
            for (i, name) in order.iter().enumerate() {
                if i == order.len() / 2 {
                    halfway.wait();
                }
                let mut e = event(i as i64, 1);
                e.workload = (*name).clone();
                e.model = Some((*name).clone());
                e.tenant = Some((*name).clone());
                sink.push(&e)?;
            }
            Ok::<_, LedgerError>(())
        })
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| write(false));
        let b = s.spawn(|| write(true));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a.unwrap().0, 6);
    assert_eq!(b.unwrap().0, 6);
    let ledger = Ledger::open(Location::parse(&url)).unwrap();
    let info = ledger.info().unwrap();
    assert_eq!(info.events, 12);
    let mut spend = ledger.tenant_spend(0).unwrap();
    spend.sort();
    let expected: Vec<(String, Money)> = names
        .iter()
        .map(|n| (n.clone(), Money::from_cents(2)))
        .collect();
    assert_eq!(
        spend, expected,
        "each name once in dims, both writers' events on it"
    );
    let dims: i64 = raw(&url)
        .query_one("SELECT count(*) FROM dims", &[])
        .unwrap()
        .get(0);
    assert_eq!(dims, 18, "six names on three axes");
}

/// `frugal train` and `frugal tune` record segments from inside their async runtime; the
/// blocking client's own runtime may not start on that thread, so the write moves off it.
#[test]
fn a_write_from_inside_an_async_runtime_is_stored() {
    let (_, mut ledger) = fresh();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async { ledger.append("train", &[event(1, 1)]) });
    assert_eq!(stored.unwrap(), 1);
    assert_eq!(ledger.info().unwrap().events, 1);
}

/// PostgreSQL killed while an import sends its batches: the import fails, nothing of it is
/// stored, and once the server is back the same import stores it all.
#[test]
fn a_server_killed_mid_import_keeps_nothing_of_it_and_a_rerun_works() {
    let mut server = Server::start().unwrap();
    let url = server.database().unwrap();
    let mut ledger = Ledger::open(Location::parse(&url)).unwrap();
    ledger.append("before", &[event(1, 1)]).unwrap();
    let rows: Vec<Event> = (0..200_000).map(|i| event(10 + i, 1)).collect();
    let import = |ledger: &mut Ledger, signal: Option<std::sync::mpsc::Sender<()>>| {
        ledger.import("big.csv", "csv", |sink| {
            for (i, e) in rows.iter().enumerate() {
                sink.push(e)?;
                if i == 40_000
                    && let Some(signal) = &signal
                {
                    let _ = signal.send(());
                }
            }
            Ok::<_, LedgerError>(())
        })
    };
    let (signal, sending) = std::sync::mpsc::channel();
    let killed = std::thread::scope(|s| {
        let importer = s.spawn(|| import(&mut ledger, Some(signal)));
        sending.recv().unwrap();
        server.kill().unwrap();
        importer.join().unwrap()
    });
    let err = killed.err().unwrap().to_string();
    assert!(err.contains("nothing from this write was stored"), "{err}");
    drop(ledger);
    server.restart().unwrap();
    let mut ledger = Ledger::open(Location::parse(&url)).unwrap();
    let info = ledger.info().unwrap();
    assert_eq!(
        (info.events, info.imports),
        (1, 1),
        "nothing of the killed import"
    );
    let (stored, ()) = import(&mut ledger, None).unwrap();
    assert_eq!(stored, 200_000);
    assert_eq!(ledger.info().unwrap().events, 200_001);
}

/// The writer's connection is kept between writes: after the server restarts, the next
/// write connects anew rather than failing on the dead one.
#[test]
fn a_write_after_the_server_restarted_goes_through() {
    let mut server = Server::start().unwrap();
    let url = server.database().unwrap();
    let mut ledger = Ledger::open(Location::parse(&url)).unwrap();
    ledger.append("before", &[event(1, 1)]).unwrap();
    server.kill().unwrap();
    server.restart().unwrap();
    ledger.append("after", &[event(3, 1)]).unwrap();
    server.kill().unwrap();
    server.restart().unwrap();
    ledger.append("after again", &[event(4, 1)]).unwrap();
    let info = ledger.info().unwrap();
    assert_eq!((info.events, info.imports), (3, 3));
}

/// `sslmode=require` goes through TLS or not at all: a server without it is refused, by
/// name, rather than spoken to in the clear.
#[test]
fn sslmode_require_refuses_a_server_without_tls() {
    let url = format!("{}?sslmode=require", database());
    let err = Ledger::open(Location::parse(&url)).err().unwrap();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        text.starts_with("cannot connect to ledger postgres://postgres:***@127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains("TLS"), "{text}");
}
