use rivora::dataplane::{Datapath, LoadOptions, Maps};

#[test]
fn programs_load_and_share_pinned_maps() {
    let dir = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/rivora-test-smoke-{}",
        std::process::id()
    ));
    let opts = LoadOptions {
        pin_dir: dir.clone(),
        ..Default::default()
    };
    let dp = Datapath::load(&opts).expect("load");
    let maps = Maps::open(&dir).expect("open pins");
    for name in Maps::NAMES {
        assert!(dir.join(name).exists(), "{name} pinned");
    }
    drop(maps);
    drop(dp);
    Datapath::unpin_all(&dir).unwrap();
}
