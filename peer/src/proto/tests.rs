//! Round trips, hostile inputs and the in-place readers of the peer codec.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use proptest::prelude::*;

fn id(b: u8) -> ChunkId {
    ChunkId::of(&[b])
}

fn requests() -> Vec<Request> {
    vec![
        Request::Hello {
            version: VERSION,
            job: "job-1".into(),
        },
        Request::PutChunk {
            id: id(1),
            frame: vec![1, 2, 3],
        },
        Request::HasChunks(vec![id(1), id(2)]),
        Request::GetChunk {
            id: id(3),
            range: None,
        },
        Request::GetChunk {
            id: id(3),
            range: Some((5, 9)),
        },
        Request::PutManifest {
            step: 7,
            rank: 2,
            bytes: vec![9; 40],
        },
        Request::GetManifest { step: 7, rank: 2 },
        Request::ListSteps,
        Request::Commit(vec![4; 10]),
        Request::DeleteStep(3),
        Request::DeleteShard { step: 3, rank: 5 },
        Request::DeleteChunks(vec![id(4)]),
        Request::ListChunks { after: None },
        Request::ListChunks {
            after: Some(ChunkId::of(b"cursor")),
        },
        Request::Stats,
        Request::SetPin {
            step: 9,
            pinned: true,
        },
        Request::SetPin {
            step: u64::MAX,
            pinned: false,
        },
        Request::ListPins,
    ]
}

fn responses() -> Vec<Response> {
    vec![
        Response::Ok,
        Response::HelloOk {
            version: 1,
            node: "node-a".into(),
        },
        Response::Error {
            code: ErrorCode::Forbidden,
            message: "no".into(),
        },
        Response::Stored { new: true },
        Response::Frame(vec![1; 100]),
        Response::Bytes(vec![]),
        Response::Present(vec![
            true, false, true, true, false, false, false, false, true,
        ]),
        Response::Steps(vec![
            StepEntry {
                step: 1,
                manifests: vec![0, 1],
                records: vec![vec![1, 2], vec![3]],
            },
            StepEntry::default(),
        ]),
        Response::Ids(vec![id(1), id(9)]),
        Response::Stats(ServiceStats {
            bytes_in_memory: 1,
            errors: 9,
            ..ServiceStats::default()
        }),
        Response::Pins(vec![]),
        Response::Pins(vec![1, 1000, u64::MAX]),
    ]
}

#[test]
fn every_message_round_trips_and_states_its_length() {
    for r in requests() {
        let enc = r.encode();
        let n = message_len(enc[..4].try_into().unwrap()).unwrap();
        assert_eq!(n, enc.len() - 4);
        assert_eq!(Request::decode(&enc[4..]).unwrap(), r);
    }
    for r in responses() {
        let enc = r.encode();
        assert_eq!(Response::decode(&enc[4..]).unwrap(), r);
    }
}

#[test]
fn bytes_envelopes_match_the_encoder() {
    for n in [0usize, 1, 5000] {
        let b = vec![7u8; n];
        let enc = Response::Bytes(b.clone()).encode();
        let head = crate::proto::bytes_envelope(n);
        assert_eq!(&enc[..head.len()], &head[..]);
        assert_eq!(&enc[head.len()..], &b[..]);
    }
}

#[test]
fn frame_envelopes_match_the_encoder() {
    let f = vec![9u8; 1000];
    let enc = Response::Frame(f.clone()).encode();
    assert_eq!(&enc[..9], &frame_envelope(f.len()));
    assert_eq!(frame_in(&enc[4..]), Some(f.as_slice()));
    assert_eq!(frame_in(&Response::Ok.encode()[4..]), None);
    assert_eq!(frame_in(&enc[4..enc.len() - 1]), None);
    assert_eq!(frame_len_in(&enc[4..20]), Some(f.len()));
    assert_eq!(frame_len_in(&Response::Ok.encode()[4..]), None);
    assert_eq!(frame_len_in(&enc[4..7]), None);
}

#[test]
fn put_chunk_envelopes_match_the_encoder() {
    let frame = vec![7u8; 1000];
    let req = Request::PutChunk {
        id: id(5),
        frame: frame.clone(),
    };
    let enc = req.encode();
    let head = put_chunk_envelope(&id(5), frame.len()).unwrap();
    assert_eq!(&enc[..41], &head);
    assert_eq!(&enc[41..], frame.as_slice());
    assert_eq!(put_chunk_in(&enc[4..]), Some((id(5), 37)));
    // Short, long, or another kind: not a put.
    assert_eq!(put_chunk_in(&enc[4..enc.len() - 1]), None);
    let mut long = enc[4..].to_vec();
    long.push(0);
    assert_eq!(put_chunk_in(&long), None);
    assert_eq!(put_chunk_in(&Request::Stats.encode()[4..]), None);
    assert_eq!(put_chunk_in(&enc[4..20]), None);
    assert!(put_chunk_envelope(&id(5), MAX_MESSAGE).is_none());
}

#[test]
fn hostile_lengths_and_values_are_refused() {
    assert!(message_len((MAX_MESSAGE as u32 + 1).to_le_bytes()).is_err());
    assert!(message_len(0u32.to_le_bytes()).is_err());
    assert!(message_len(u32::MAX.to_le_bytes()).is_err());
    // A count of ids far beyond the bytes present.
    let mut m = vec![kind::HAS_CHUNKS];
    m.extend_from_slice(&(MAX_IDS as u32).to_le_bytes());
    assert!(Request::decode(&m).is_err());
    // A blob claiming 4 GiB.
    let mut m = vec![kind::COMMIT];
    m.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Request::decode(&m).is_err());
    // A bad job id, an inverted range, trailing bytes, unknown kinds.
    let bad_job = Request::Hello {
        version: 1,
        job: "../etc".into(),
    }
    .encode();
    assert!(Request::decode(&bad_job[4..]).is_err());
    let mut m = vec![kind::GET_CHUNK];
    m.extend_from_slice(id(1).as_bytes());
    m.push(1);
    m.extend_from_slice(&9u32.to_le_bytes());
    m.extend_from_slice(&5u32.to_le_bytes());
    assert!(Request::decode(&m).is_err());
    let mut ok = Request::Stats.encode();
    ok.push(0);
    assert!(Request::decode(&ok[4..]).is_err());
    assert!(Request::decode(&[200]).is_err());
    assert!(Response::decode(&[1]).is_err());
    assert!(Request::decode(&[]).is_err());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = fuzz_decode(&data);
    }

    #[test]
    fn the_in_place_put_reader_agrees_with_the_decoder(
        frame in proptest::collection::vec(any::<u8>(), 0..200),
        cut in 0usize..260,
        stated in proptest::option::of(0u32..300),
    ) {
        let mut m = Request::PutChunk { id: id(1), frame }.encode()[4..].to_vec();
        if let Some(n) = stated {
            m[33..37].copy_from_slice(&n.to_le_bytes());
        }
        m.truncate(cut.max(1));
        // Panics if the two disagree.
        let _ = fuzz_decode(&m);
    }

    #[test]
    fn any_truncation_of_a_valid_message_is_an_error(cut in 0usize..60) {
        for r in requests() {
            let enc = r.encode();
            let body = &enc[4..];
            if cut < body.len() {
                prop_assert!(Request::decode(&body[..cut]).is_err());
            }
        }
    }
}
