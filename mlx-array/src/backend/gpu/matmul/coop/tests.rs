use super::*;

/// `(buffers, staged, bytes)` of `tiling` within `limit` bytes.
fn chosen(tiling: Tiling, limit: usize, double: bool) -> (usize, usize, usize) {
    let s = Staging::choose(tiling, limit, double);
    (s.buffers, s.staged, tiling.shared_bytes_for(s))
}

#[test]
fn stagings_fill_the_workgroup_memory_as_documented() {
    let (h100, lavapipe) = (48 << 10, 32 << 10);
    // Two buffers where they fit, the staging fragments in what is left.
    assert_eq!(chosen(Tiling::LARGE_4, h100, true), (2, 2, 46_080));
    assert_eq!(chosen(Tiling::LARGE_8, h100, true), (2, 1, 46_080));
    assert_eq!(chosen(Tiling::SMALL, h100, true), (2, 4, 35_840));
    // One buffer: more staging fragments a round.
    assert_eq!(chosen(Tiling::LARGE_4, h100, false), (1, 4, 35_328));
    assert_eq!(chosen(Tiling::LARGE_8, h100, false), (1, 2, 35_328));
    assert_eq!(chosen(Tiling::SMALL, h100, false), (1, 4, 26_112));
    // 32 KiB: only the 64 x 64 tiling has room for two buffers.
    assert_eq!(chosen(Tiling::LARGE_4, lavapipe, true), (1, 2, 27_136));
    assert_eq!(chosen(Tiling::LARGE_8, lavapipe, true), (1, 1, 27_136));
    assert_eq!(chosen(Tiling::SMALL, lavapipe, true), (2, 2, 27_648));
    // The least always fits where the template runs at all.
    for tiling in Tiling::ALL {
        assert_eq!(
            tiling.shared_bytes(),
            tiling.shared_bytes_for(Staging::LEAST)
        );
        assert!(tiling.shared_bytes() <= lavapipe);
    }
}

#[test]
fn the_double_buffered_loop_has_one_barrier_a_slice() {
    let barriers = |staging: Staging| {
        let src = source(
            Tiling::SMALL,
            staging,
            Fragments::Plain,
            View {
                a_cols: false,
                b_cols: false,
            },
            Dtype::F16,
            Epilogue::Store,
            VecLoads::default(),
        );
        let main = &src[src.find("loop {").unwrap()..src.find("let ob =").unwrap()];
        main.matches("workgroupBarrier()").count()
    };
    let one = |staged| Staging { buffers: 1, staged };
    let two = Staging {
        buffers: 2,
        staged: 4,
    };
    assert_eq!(barriers(one(4)), 2);
    assert_eq!(barriers(two), 1);
}
