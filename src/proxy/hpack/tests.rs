use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fields(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
    let mut out = Vec::new();
    decoder.decode(block, |n, v| {
        out.push((
            String::from_utf8_lossy(n).into_owned(),
            v.map_or("<long>".into(), |v| String::from_utf8_lossy(v).into_owned()),
        ));
    })?;
    Ok(out)
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// RFC 7541 C.4: three requests on one connection, Huffman-coded, the
/// later ones leaning on the dynamic table the earlier ones filled.
#[test]
fn the_rfc_huffman_request_examples_decode() {
    let mut decoder = Decoder::new();
    let first = fields(
        &mut decoder,
        &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
    )
    .unwrap();
    assert_eq!(
        first,
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ])
    );
    let second = fields(&mut decoder, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
    assert_eq!(second[3], (":authority".into(), "www.example.com".into()));
    assert_eq!(second[4], ("cache-control".into(), "no-cache".into()));
    let third = fields(
        &mut decoder,
        &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    )
    .unwrap();
    assert_eq!(
        third,
        pairs(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    );
    // 3 entries: custom-key (54), cache-control (53), :authority (57).
    assert_eq!(decoder.table.len(), 3);
    assert_eq!(decoder.size, 164);
}

/// RFC 7541 C.3.1, the same first request without Huffman coding.
#[test]
fn plain_literals_decode() {
    let mut decoder = Decoder::new();
    let block = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
    assert_eq!(
        fields(&mut decoder, &block).unwrap()[3].1,
        "www.example.com"
    );
}

#[test]
fn a_small_table_evicts_and_size_updates_are_checked() {
    let mut decoder = Decoder::new();
    // Shrink to 60 bytes: one "custom-key: custom-value" (54) fits.
    let mut block = vec![0x3f, 0x1d]; // size update to 31 + 29 = 60
    block.extend(hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"));
    fields(&mut decoder, &block).unwrap();
    assert_eq!(decoder.table.len(), 1);
    // A second entry evicts the first.
    fields(
        &mut decoder,
        &hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    )
    .unwrap();
    assert_eq!((decoder.table.len(), decoder.size), (1, 54));
    // Over the allowed size, or after a field: refused.
    assert_eq!(
        fields(&mut decoder, &[0x3f, 0xe2, 0x1f]),
        Err(HpackError::TableSize(4097))
    );
    assert!(matches!(
        fields(&mut decoder, &[0x82, 0x20]),
        Err(HpackError::TableSize(0))
    ));
    decoder.allow(8192);
    fields(&mut decoder, &[0x3f, 0xe2, 0x1f]).unwrap();
}

/// A block fed a byte at a time decodes as it does whole, and keeps
/// at most one unfinished field.
#[test]
fn blocks_decode_the_same_in_any_pieces() {
    let blocks = [
        hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        hex("8286 84be 5886 a8eb 1064 9cbf"),
        hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    ];
    let mut whole = Decoder::new();
    let mut pieces = Decoder::new();
    for block in &blocks {
        let expected = fields(&mut whole, block).unwrap();
        let mut got = Vec::new();
        for byte in block.chunks(1) {
            pieces
                .feed(byte, &mut |n, v| {
                    got.push((
                        String::from_utf8_lossy(n).into_owned(),
                        String::from_utf8_lossy(v.unwrap()).into_owned(),
                    ));
                })
                .unwrap();
            assert!(pieces.block.tail.len() <= 30);
        }
        pieces.end().unwrap();
        assert_eq!(got, expected);
    }
    assert_eq!(whole.table, pieces.table);
}

/// One-byte references to a 4 KB entry: each costs a reference, and
/// past the header list limit the fields are no longer reported.
#[test]
fn references_to_a_large_entry_are_bounded() {
    let mut decoder = Decoder::new();
    let path = format!("/{}", "p".repeat(3_990));
    let mut first = vec![0x44, 0x7f];
    let mut n = path.len() - 127;
    while n >= 128 {
        first.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    first.push(n as u8);
    first.extend_from_slice(path.as_bytes());
    assert_eq!(fields(&mut decoder, &first).unwrap()[0].1, path);
    let flood = vec![0xbe; 1 << 20];
    let mut reported = 0usize;
    for piece in flood.chunks(16_384) {
        decoder.feed(piece, &mut |_, _| reported += 1).unwrap();
    }
    decoder.end().unwrap();
    let per_field = path.len() + 5 + ENTRY_OVERHEAD;
    assert_eq!(reported, MAX_LIST / per_field);
    // The next block is reported again.
    assert_eq!(fields(&mut decoder, &[0xbe]).unwrap()[0].1, path);
}

/// A value far longer than the table streams past: not buffered, not
/// reported, and (indexed) it empties the table as RFC 7541 says.
#[test]
fn a_long_value_streams_past() {
    let mut decoder = Decoder::new();
    fields(
        &mut decoder,
        &hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    )
    .unwrap();
    assert_eq!(decoder.entries(), 1);
    let len = 1_500_000usize;
    // Literal with incremental indexing, indexed name 58 (user-agent).
    let mut block = vec![0x40 | 58 & 0x3f, 0x7f];
    let mut n = len - 127;
    while n >= 128 {
        block.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    block.push(n as u8);
    block.extend(std::iter::repeat_n(b'a', len));
    block.push(0x82);
    let mut got = Vec::new();
    for piece in block.chunks(16_384) {
        decoder
            .feed(piece, &mut |n, v| {
                got.push((n.to_vec(), v.map(<[u8]>::len)))
            })
            .unwrap();
        assert!(decoder.block.tail.len() < 16);
    }
    decoder.end().unwrap();
    assert_eq!(
        got,
        [
            (b"user-agent".to_vec(), None),
            (b":method".to_vec(), Some(3))
        ]
    );
    assert_eq!(decoder.entries(), 0);
}

#[test]
fn malformed_blocks_are_errors_not_panics() {
    let mut decoder = Decoder::new();
    for block in [
        &[0x80][..],                                     // index 0
        &[0xbe][..],                                     // dynamic entry that does not exist
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],       // integer overflow
        &[0x40, 0x05, b'a'][..],                         // string shorter than announced
        &[0x40, 0x81, 0x00, 0x00][..],                   // Huffman: zeros are not padding
        &[0x40, 0x84, 0xff, 0xff, 0xff, 0xff, 0x00][..], // EOS inside
        &[0x40, 0x82, 0x1f, 0xff, 0x00][..],             // padding longer than 7 bits
        &[0x7f][..],                                     // truncated integer
    ] {
        assert!(fields(&mut decoder, block).is_err(), "{block:02x?}");
    }
}

#[test]
fn every_symbol_round_trips_through_the_canonical_code() {
    let table = canonical();
    // Encode each byte with the canonical code, then decode it back.
    let code_of = |symbol: u16| -> (u32, u32) {
        let len = u32::from(CODE_LENGTHS[usize::from(symbol)]);
        let l = len as usize;
        let rank = table.symbols[table.offset[l]..table.offset[l] + table.count[l] as usize]
            .iter()
            .position(|&s| s == symbol)
            .unwrap();
        (table.first[l] + rank as u32, len)
    };
    assert_eq!(code_of(u16::from(b'0')), (0b00000, 5));
    assert_eq!(code_of(EOS), (0x3fff_ffff, 30));
    let input: Vec<u8> = (0..=255).collect();
    let (mut acc, mut n, mut raw) = (0u128, 0u32, Vec::new());
    for &b in &input {
        let (code, len) = code_of(u16::from(b));
        acc = (acc << len) | u128::from(code);
        n += len;
        while n >= 8 {
            raw.push((acc >> (n - 8)) as u8);
            n -= 8;
        }
    }
    if n > 0 {
        raw.push(((acc << (8 - n)) as u8) | ((1u8 << (8 - n)) - 1));
    }
    assert_eq!(huffman_decode(&raw).unwrap(), input);
}
