//! The vocabulary of a mount's figures, below every layer: the latency histogram each layer
//! keeps of its own requests ([`latency`]), and [`Families`], in which a layer writes out the
//! counters it owns, under their Prometheus names, when asked (at a scrape, for `unkai stats`).
//!
//! Each layer owns its figures (plain atomics, and these histograms: `vfs::export::requests`,
//! `object::traffic`, `data`'s caches and stage, the metadata engines) and names them here,
//! beside the code that counts; `volume::metrics` asks each for its families, labels them
//! with the volume's name and serves them. So counting costs an atomic increment on the hot
//! path, and no layer imports another to be counted (see docs/design.md, "Metrics").
//!
//! Round trips to the metadata database are also tallied per thread ([`round_trips`],
//! [`round_trips_here`]): the engine counts each exchange where it makes it, and the layer
//! answering a request (the FUSE adapter) reads the tally before and after, so round trips
//! are known per request kind without the engine knowing what request it serves.
//!
//! Not for: serving or labelling figures by volume (that is `volume::metrics`), or deciding
//! anything from them.

use std::cell::Cell;

use prometheus::core::Collector;
use prometheus::proto::{self, MetricType};

pub use prometheus::Histogram;
pub use prometheus::proto::MetricFamily;

/// Upper bounds, in seconds, of the latency histograms: 100 µs to 10 s, about 2.5 per step.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The help of `unkai_memory_bytes`, whose samples several layers give (the first given is
/// the family's).
pub const MEMORY_HELP: &str = "Memory the mount holds, by use: write buffers, blocks cached, blocks \
     in flight (uploads, fetches, read-ahead).";

thread_local! {
    static ROUND_TRIPS: Cell<u64> = const { Cell::new(0) };
}

/// Counts `n` round trips this thread made to the metadata database (see
/// [`round_trips_here`]).
pub fn round_trips(n: u64) {
    ROUND_TRIPS.with(|c| c.set(c.get().wrapping_add(n)));
}

/// Round trips this thread has made so far: the difference across a request is what the
/// request cost.
pub fn round_trips_here() -> u64 {
    ROUND_TRIPS.with(Cell::get)
}

/// A latency histogram of series `name` with the one label `label` (e.g. `("op", "read")`):
/// observing is a few atomic operations, without a lock or an allocation.
pub fn latency(name: &str, help: &str, label: (&str, &str)) -> Histogram {
    let opts = prometheus::HistogramOpts::new(name, help)
        .const_label(label.0, label.1)
        .buckets(LATENCY_BUCKETS.to_vec());
    Histogram::with_opts(opts).expect("a valid histogram: fixed name, label and buckets")
}

/// A latency histogram of series `name` with the labels `labels` (e.g. `[("proto", "fuse"),
/// ("op", "read")]`), as [`latency`].
pub fn latency_of(name: &str, help: &str, labels: &[(&str, &str)]) -> Histogram {
    let mut opts = prometheus::HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    for (k, v) in labels {
        opts = opts.const_label(*k, *v);
    }
    Histogram::with_opts(opts).expect("a valid histogram: fixed name, labels and buckets")
}

/// Metric families being written out: the samples of one name (with different labels) make
/// one family, wherever they are written.
#[derive(Default)]
pub struct Families(pub Vec<MetricFamily>);

impl Families {
    /// The family `name`, made on its first sample (its help is the first one given).
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        match self.0.iter().position(|f| f.name() == name) {
            Some(i) => &mut self.0[i],
            None => {
                let mut f = MetricFamily::default();
                f.set_name(name.into());
                f.set_help(help.into());
                f.set_field_type(kind);
                self.0.push(f);
                self.0.last_mut().expect("just pushed")
            }
        }
    }

    fn sample(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        labels: &[(&str, &str)],
    ) -> &mut proto::Metric {
        let f = self.family(name, help, kind);
        let mut m = proto::Metric::default();
        m.set_label(labels.iter().map(|(k, v)| label(k, v)).collect());
        f.mut_metric().push(m);
        f.mut_metric().last_mut().expect("just pushed")
    }

    /// A counter: a total since the mount started, which only grows.
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: u64) {
        let mut c = proto::Counter::default();
        c.set_value(v as f64);
        self.sample(name, help, MetricType::COUNTER, labels)
            .set_counter(c);
    }

    /// A gauge: a level now (bytes staged, memory in use).
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: u64) {
        let mut g = proto::Gauge::default();
        g.set_value(v as f64);
        self.sample(name, help, MetricType::GAUGE, labels)
            .set_gauge(g);
    }

    /// The histograms `hs`, made by [`latency`] under one name (one per label value).
    pub fn histograms<'a>(&mut self, hs: impl IntoIterator<Item = &'a Histogram>) {
        for h in hs {
            for mut f in h.collect() {
                let help = f.help().to_string();
                let name = f.name().to_string();
                let family = self.family(&name, &help, MetricType::HISTOGRAM);
                family.mut_metric().extend(f.take_metric());
            }
        }
    }

    /// Adds the label `name="value"` to every sample (the volume's name).
    pub fn label_all(&mut self, name: &str, value: &str) {
        for f in &mut self.0 {
            for m in f.mut_metric() {
                let mut labels = m.take_label();
                labels.insert(0, label(name, value));
                m.set_label(labels);
            }
        }
    }

    /// The families in Prometheus' text format (version 0.0.4).
    pub fn text(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.0)
            .unwrap_or_else(|e| format!("# error encoding the figures: {e}\n"))
    }

    /// The families as JSON, for `unkai stats`: `{"NAME": [{"labels": {...}, "value": V}]}`
    /// (counters and gauges), or `"count": N, "sum": S` (histograms, S in seconds).
    pub fn json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for f in &self.0 {
            let samples: Vec<serde_json::Value> = f
                .get_metric()
                .iter()
                .map(|m| {
                    let labels: serde_json::Map<String, serde_json::Value> = m
                        .get_label()
                        .iter()
                        .map(|l| (l.name().to_string(), l.value().into()))
                        .collect();
                    let mut s = serde_json::json!({ "labels": labels });
                    match f.get_field_type() {
                        MetricType::HISTOGRAM => {
                            let h = m.get_histogram();
                            s["count"] = h.get_sample_count().into();
                            s["sum"] = h.get_sample_sum().into();
                        }
                        MetricType::GAUGE => s["value"] = m.get_gauge().get_value().into(),
                        _ => s["value"] = m.get_counter().get_value().into(),
                    }
                    s
                })
                .collect();
            out.insert(f.name().to_string(), samples.into());
        }
        out.into()
    }
}

fn label(name: &str, value: &str) -> proto::LabelPair {
    let mut l = proto::LabelPair::default();
    l.set_name(name.into());
    l.set_value(value.into());
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_in_the_text_format_with_the_volume_label() {
        let mut f = Families::default();
        f.counter("unkai_x_total", "Xs.", &[("op", "a")], 3);
        f.counter("unkai_x_total", "Xs.", &[("op", "b")], 4);
        f.gauge("unkai_y_bytes", "Ys.", &[], 7);
        f.counter("unkai_x_total", "", &[("op", "c")], 5);
        let h1 = latency("unkai_z_seconds", "Zs.", ("op", "a"));
        let h2 = latency("unkai_z_seconds", "Zs.", ("op", "b"));
        h1.observe(0.002);
        h1.observe(20.0);
        f.histograms([&h1, &h2]);
        f.label_all("volume", "v1");
        assert_eq!(f.0.len(), 3, "samples of one name make one family");
        let t = f.text();
        assert!(t.contains("# TYPE unkai_x_total counter"), "{t}");
        assert!(t.contains("unkai_x_total{volume=\"v1\",op=\"b\"} 4"), "{t}");
        assert!(t.contains("unkai_y_bytes{volume=\"v1\"} 7"), "{t}");
        assert_eq!(t.matches("# TYPE unkai_x_total").count(), 1, "{t}");
        assert!(t.contains("# HELP unkai_x_total Xs."), "{t}");
        assert!(t.contains("unkai_x_total{volume=\"v1\",op=\"c\"} 5"), "{t}");
        assert!(
            t.contains("unkai_z_seconds_bucket{volume=\"v1\",op=\"a\",le=\"0.0025\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("unkai_z_seconds_count{volume=\"v1\",op=\"a\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("unkai_z_seconds_count{volume=\"v1\",op=\"b\"} 0"),
            "{t}"
        );
        let j = f.json();
        assert_eq!(j["unkai_x_total"][1]["value"], 4.0);
        assert_eq!(j["unkai_x_total"][1]["labels"]["op"], "b");
        assert_eq!(j["unkai_z_seconds"][0]["count"], 2);
    }
}
