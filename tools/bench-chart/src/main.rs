//! `bench-chart`: draws the throughput chart of a `scripts/compare-peers.sh` run.
//!
//! ```text
//! cargo run -p bench-chart -- bench-results/<timestamp>.jsonl docs/throughput.svg [--scenario happy]
//! ```
//!
//! It reads the JSONL file (one result object a line: the peers' lines as the peer harness
//! writes them, ours as `example-sagas bench --json` prints them; `meta` and `failed` lines are
//! skipped), takes the median sagas/s of every system at every concurrency for one scenario
//! (default `happy`), and writes an SVG line chart: sagas/s (log scale) against concurrency
//! (log scale), one line per system (ours on SQLite, ours on PostgreSQL, each peer).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use plotters::prelude::*;
use serde_json::Value;

/// One successful benchmark run, normalised from either line format.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    /// `ours-sqlite`, `ours-postgres`, `restate`, …
    system: String,
    /// `happy` or `compensate`.
    scenario: String,
    /// Sagas kept in flight.
    concurrency: u32,
    /// Throughput of the run.
    sagas_per_s: f64,
}

/// Normalises one JSON line; `None` for meta lines, failed runs and lines of another shape.
fn parse_line(line: &str) -> Option<Run> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v.get("meta").is_some() || v.get("failed").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let sagas_per_s = v.get("sagas_per_s")?.as_f64()?;
    let scenario = v.get("scenario")?.as_str()?.to_owned();
    let (system, concurrency) = if let Some(backend) = v.get("backend").and_then(Value::as_str) {
        let processes = v.get("processes").and_then(Value::as_u64).unwrap_or(1);
        let system = if processes > 1 {
            format!("ours-{backend}-p{processes}")
        } else {
            format!("ours-{backend}")
        };
        (system, v.get("concurrency")?.as_u64()?)
    } else {
        (v.get("peer")?.as_str()?.to_owned(), v.get("c")?.as_u64()?)
    };
    Some(Run {
        system,
        scenario,
        concurrency: u32::try_from(concurrency).ok()?,
        sagas_per_s,
    })
}

/// The median of `values` (which must not be empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Median sagas/s per system and concurrency, for one scenario.
type Series = BTreeMap<String, BTreeMap<u32, f64>>;

/// Groups the runs of `scenario` into one median per system and concurrency.
fn medians(runs: &[Run], scenario: &str) -> Series {
    let mut groups: BTreeMap<String, BTreeMap<u32, Vec<f64>>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.scenario == scenario) {
        groups
            .entry(run.system.clone())
            .or_default()
            .entry(run.concurrency)
            .or_default()
            .push(run.sagas_per_s);
    }
    groups
        .into_iter()
        .map(|(system, by_c)| {
            let by_c = by_c
                .into_iter()
                .map(|(c, mut v)| (c, median(&mut v)))
                .collect();
            (system, by_c)
        })
        .collect()
}

/// Display order: ours first, then the peers as the harness lists them, then anything else.
fn rank(system: &str) -> (usize, &str) {
    const ORDER: [&str; 8] = [
        "ours-sqlite",
        "ours-postgres",
        "restate",
        "underway",
        "dbos",
        "dbos-sqlite",
        "temporal",
        "temporal-wal",
    ];
    let i = ORDER
        .iter()
        .position(|s| *s == system)
        .unwrap_or(if system.starts_with("ours-") {
            2
        } else {
            ORDER.len()
        });
    (i, system)
}

/// The 1-2-5 sequence (…, 10, 20, 50, 100, …) within `lo..=hi`: the y axis' labelled values.
fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
    let mut points = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if (lo..=hi).contains(&v) {
                points.push(v);
            }
        }
        decade *= 10.0;
    }
    points
}

/// Line colours: ours in strong colours, peers after them.
const COLOURS: [RGBColor; 8] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Draws `series` into an SVG file at `out`.
fn draw(series: &Series, scenario: &str, title_note: &str, out: &Path) -> Result<(), String> {
    let mut systems: Vec<&String> = series.keys().collect();
    systems.sort_by(|a, b| rank(a).cmp(&rank(b)));
    let mut concurrencies: Vec<u32> = series.values().flat_map(|m| m.keys().copied()).collect();
    concurrencies.sort_unstable();
    concurrencies.dedup();
    let values = series.values().flat_map(|m| m.values().copied());
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (Some(&c_min), Some(&c_max)) = (concurrencies.first(), concurrencies.last()) else {
        return Err(format!("no {scenario} results to draw"));
    };
    if !(lo > 0.0 && hi.is_finite()) {
        return Err("sagas/s must be positive to draw on a log scale".to_owned());
    }

    let root = SVGBackend::new(out, (900, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x_range = (f64::from(c_min) / 1.5)..(f64::from(c_max) * 1.5);
    let x_keys: Vec<f64> = concurrencies.iter().map(|&c| f64::from(c)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Saga throughput, {scenario} scenario{title_note}"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            x_range.log_scale().with_key_points(x_keys),
            ((lo / 2.0)..(hi * 2.0))
                .log_scale()
                .with_key_points(one_two_five(lo / 2.0, hi * 2.0)),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("concurrency (sagas in flight)")
        .y_desc("sagas/s (median of runs, log scale)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .x_label_formatter(&|c| format!("{c:.0}"))
        .y_label_formatter(&|v| {
            if *v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(&e))?;

    for (i, system) in systems.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let width = if system.starts_with("ours-") { 3 } else { 2 };
        let points: Vec<(f64, f64)> = series[*system]
            .iter()
            .map(|(&c, &v)| (f64::from(c), v))
            .collect();
        chart
            .draw_series(
                LineSeries::new(points, colour.stroke_width(width)).point_size(if width == 3 {
                    4
                } else {
                    3
                }),
            )
            .map_err(|e| err(&e))?
            .label(system.as_str())
            .legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(width))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Parses the command line, reads the JSONL file and writes the chart.
fn run(args: &[String]) -> Result<(), String> {
    let mut scenario = "happy".to_owned();
    let mut paths = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--scenario" => scenario = it.next().ok_or("--scenario needs a value")?.clone(),
            "-h" | "--help" => {
                println!(
                    "usage: bench-chart RESULTS.jsonl [OUT.svg] [--scenario happy|compensate]\n\
                     default OUT.svg: docs/throughput.svg"
                );
                return Ok(());
            }
            _ => paths.push(a.clone()),
        }
    }
    let (input, out) = match paths.as_slice() {
        [input] => (input.clone(), "docs/throughput.svg".to_owned()),
        [input, out] => (input.clone(), out.clone()),
        _ => return Err("usage: bench-chart RESULTS.jsonl [OUT.svg] [--scenario S]".to_owned()),
    };
    let text = std::fs::read_to_string(&input).map_err(|e| format!("reading {input}: {e}"))?;
    let runs: Vec<Run> = text.lines().filter_map(parse_line).collect();
    let series = medians(&runs, &scenario);
    if series.is_empty() {
        return Err(format!("{input}: no successful {scenario} runs"));
    }
    let stem = Path::new(&input)
        .file_stem()
        .map(|s| format!(" ({})", s.to_string_lossy()))
        .unwrap_or_default();
    let out = Path::new(&out);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    draw(&series, &scenario, &stem, out)?;
    eprintln!(
        "wrote {} ({} systems, {} runs)",
        out.display(),
        series.len(),
        runs.iter().filter(|r| r.scenario == scenario).count()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-chart: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = r#"{"peer": "restate", "scenario": "happy", "n": 4000, "c": 16, "sagas_per_s": 304.6, "p50_ms": 52.3, "errors": 0}"#;
    const OURS: &str = r#"{"backend":"sqlite","scenario":"happy","sagas":10000,"concurrency":16,"processes":1,"sagas_per_s":1500.0,"p50_ms":10.0,"errors":0}"#;

    #[test]
    fn parses_both_line_formats_and_skips_the_rest() {
        assert_eq!(
            parse_line(PEER),
            Some(Run {
                system: "restate".into(),
                scenario: "happy".into(),
                concurrency: 16,
                sagas_per_s: 304.6
            })
        );
        let ours = parse_line(OURS).unwrap();
        assert_eq!(
            (ours.system.as_str(), ours.concurrency),
            ("ours-sqlite", 16)
        );
        let two = OURS
            .replace(r#""processes":1"#, r#""processes":2"#)
            .replace("sqlite", "postgres");
        assert_eq!(parse_line(&two).unwrap().system, "ours-postgres-p2");
        assert_eq!(parse_line(r#"{"meta": {"repeats": 3}}"#), None);
        assert_eq!(
            parse_line(r#"{"peer":"dbos","scenario":"happy","c":1,"n":600,"failed":true}"#),
            None
        );
        assert_eq!(parse_line("not json"), None);
    }

    #[test]
    fn medians_per_system_and_concurrency() {
        let run = |system: &str, scenario: &str, c, v| Run {
            system: system.into(),
            scenario: scenario.into(),
            concurrency: c,
            sagas_per_s: v,
        };
        let runs = [
            run("dbos", "happy", 1, 50.0),
            run("dbos", "happy", 1, 60.0),
            run("dbos", "happy", 1, 55.0),
            run("dbos", "happy", 16, 10.0),
            run("dbos", "happy", 16, 20.0),
            run("dbos", "compensate", 1, 1.0),
        ];
        let m = medians(&runs, "happy");
        assert_eq!(m["dbos"][&1], 55.0);
        assert_eq!(m["dbos"][&16], 15.0);
        assert_eq!(medians(&runs, "compensate")["dbos"].len(), 1);
    }

    #[test]
    fn y_axis_key_points() {
        assert_eq!(
            one_two_five(30.0, 1200.0),
            [50.0, 100.0, 200.0, 500.0, 1000.0]
        );
    }

    #[test]
    fn writes_an_svg() {
        let dir = std::env::temp_dir().join(format!("bench-chart-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("r.jsonl");
        std::fs::write(&input, format!("{PEER}\n{OURS}\n")).unwrap();
        let out = dir.join("sub/t.svg");
        run(&[input.display().to_string(), out.display().to_string()]).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("ours-sqlite") && svg.contains("restate"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
