//! Spatial functions over GeoJSON values, with geography (WGS-84) semantics.
//!
//! A spatial argument is a GeoJSON object whose `type` is `Point`, `LineString`, `Polygon` or
//! `MultiPolygon` (the types the reference supports), with `coordinates` in degrees, longitude
//! first. A position has two or three numbers (an altitude is read and ignored).
//!
//! - Validity (`ST_ISVALID`, `ST_ISVALIDDETAILED`): latitudes within ±90 and longitudes within
//!   ±180 degrees, a LineString with at least two distinct positions, every Polygon ring closed
//!   (first position equal to the last) with at least four positions, a Polygon with at least
//!   one ring and a MultiPolygon with at least one Polygon. The reasons for a bad latitude and
//!   an unclosed ring are the reference's words; the others are Mayfly's, in the same style.
//!   Rings that cross themselves or each other are not detected (that check is quadratic).
//!   An `undefined` argument gives `undefined`; any other value that is not a valid geometry
//!   gives `false` (with a reason).
//! - The other functions give `undefined` for an argument that is not a valid geometry (the
//!   .NET SDK's documentation: "invalid geometries are equivalent to undefined").
//! - `ST_DISTANCE` is in meters on the WGS-84 ellipsoid. Two points: the geodesic distance
//!   (Karney's algorithm, `geographiclib-rs`); it agrees with the reference's examples to well
//!   under a millimeter over 3 km and to 8 cm over 1,900 km (Cosmos DB's own ellipsoidal
//!   method differs slightly). Other geometries: 0 if they intersect, else the geodesic
//!   distance between the closest pair of points found on the sphere (closest point of a
//!   great-circle edge).
//! - `ST_AREA` is in square meters on the WGS-84 ellipsoid (geodesic edges): each Polygon is
//!   the region left of its exterior ring minus the regions its holes leave out, so a ring
//!   given clockwise stands for the rest of the earth, as the reference says; a MultiPolygon
//!   sums its Polygons; a Point or LineString has area 0.
//! - `ST_WITHIN` and `ST_INTERSECTS` decide containment and crossings in the plane of
//!   longitude and latitude (edges as straight lines in degrees), honoring the ring
//!   orientation as `ST_AREA` does. This matches Cosmos DB for features up to a few hundred
//!   kilometers; edges of very long rings (where a geodesic bows away from the straight line in
//!   degrees), rings around a pole and rings across the antimeridian can be judged
//!   differently. A point on a polygon's boundary intersects it but is not within it.
//! - Every spatial function is charged its work before it runs: one step per position, and
//!   for two geometries one per pair of positions (their edges are compared pairwise), four
//!   for `ST_DISTANCE` (each pair of edges is measured four ways). Measured in a release
//!   build, 2,000,000 pairs take about 250 ms for `ST_DISTANCE` and 25 ms for `ST_INTERSECTS`.

use geographiclib_rs::{Geodesic, InverseGeodesic, PolygonArea, Winding};
use serde_json::{Map, Value};

use super::{Context, Function, FunctionError, costly};
use crate::value::{Val, boolean, json_number};

pub(super) const FUNCTIONS: &[Function] = &[
    costly("ST_DISTANCE", 2, 2, st_distance, distance_cost),
    costly("ST_WITHIN", 2, 2, st_within, pair_cost),
    costly("ST_INTERSECTS", 2, 2, st_intersects, pair_cost),
    costly("ST_ISVALID", 1, 1, st_isvalid, single_cost),
    costly("ST_ISVALIDDETAILED", 1, 1, st_isvaliddetailed, single_cost),
    costly("ST_AREA", 1, 1, st_area, single_cost),
];

/// Deepest nesting of `coordinates` (a MultiPolygon's positions are 4 arrays deep).
const MAX_COORDINATE_DEPTH: usize = 4;

/// An upper bound on the positions in a GeoJSON value's `coordinates` (every array within
/// the nesting a MultiPolygon can have).
fn positions_in(v: &Val) -> u64 {
    fn arrays(v: &Value, depth: usize) -> u64 {
        match v {
            Value::Array(items) if depth < MAX_COORDINATE_DEPTH => items
                .iter()
                .map(|i| arrays(i, depth + 1))
                .fold(1, u64::saturating_add),
            Value::Array(_) => 1,
            _ => 0,
        }
    }
    match v {
        Val::Json(Value::Object(obj)) => obj.get("coordinates").map_or(0, |c| arrays(c, 0)),
        _ => 0,
    }
}

/// One step per position.
fn single_cost(args: &[Val]) -> u64 {
    positions_in(&args[0]).saturating_add(1)
}

/// One step per pair of positions, one from each argument.
fn pair_cost(args: &[Val]) -> u64 {
    (positions_in(&args[0]).saturating_add(1)).saturating_mul(positions_in(&args[1]) + 1)
}

/// Four steps per pair of positions: each pair of edges is measured four ways.
fn distance_cost(args: &[Val]) -> u64 {
    pair_cost(args).saturating_mul(4)
}

/// A position in degrees.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pos {
    lon: f64,
    lat: f64,
}

/// A closed ring: its first and last positions are equal.
type Ring = Vec<Pos>;

#[derive(Debug)]
enum Geometry {
    Point(Pos),
    LineString(Vec<Pos>),
    /// A Polygon (one) or a MultiPolygon: each polygon's rings, the exterior first.
    Polygons(Vec<Vec<Ring>>),
}

const NOT_GEOJSON: &str = "The value is not a GeoJSON object: it must be an object whose 'type' is Point, LineString, Polygon or MultiPolygon.";

/// Reads a GeoJSON geometry, or says why it is not a valid one.
fn parse(v: &Value) -> Result<Geometry, String> {
    let Value::Object(obj) = v else {
        return Err(NOT_GEOJSON.to_owned());
    };
    let Some(Value::String(kind)) = obj.get("type") else {
        return Err(NOT_GEOJSON.to_owned());
    };
    match kind.as_str() {
        "Point" => Ok(Geometry::Point(position(coordinates(obj, "Point")?, "Point")?)),
        "LineString" => {
            let points = positions(coordinates(obj, "LineString")?, "LineString")?;
            if points.iter().all(|p| *p == points[0]) {
                return Err("The LineString input is not valid because it does not have enough distinct points. A LineString must have at least two distinct points.".to_owned());
            }
            Ok(Geometry::LineString(points))
        }
        "Polygon" => {
            let mut ring_number = 0;
            let rings = polygon(coordinates(obj, "Polygon")?, "Polygon", &mut ring_number)?;
            Ok(Geometry::Polygons(vec![rings]))
        }
        "MultiPolygon" => {
            let Value::Array(items) = coordinates(obj, "MultiPolygon")? else {
                return Err(shape("MultiPolygon"));
            };
            if items.is_empty() {
                return Err("The MultiPolygon input is not valid because it has no polygons. A MultiPolygon must have at least one polygon.".to_owned());
            }
            let mut ring_number = 0;
            let polygons = items
                .iter()
                .map(|p| polygon(p, "MultiPolygon", &mut ring_number))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Geometry::Polygons(polygons))
        }
        _ => Err("The GeoJSON type is not supported: the spatial functions take Point, LineString, Polygon and MultiPolygon.".to_owned()),
    }
}

fn coordinates<'a>(obj: &'a Map<String, Value>, kind: &str) -> Result<&'a Value, String> {
    obj.get("coordinates").ok_or_else(|| {
        format!("The {kind} input is not valid because it has no 'coordinates' property.")
    })
}

/// What a kind's `coordinates` must hold.
fn shape(kind: &str) -> String {
    let what = match kind {
        "Point" => "a position (an array of two or three numbers: longitude, latitude, altitude)",
        "LineString" => "an array of positions",
        "Polygon" => "an array of rings, each an array of positions",
        _ => "an array of polygons, each an array of rings of positions",
    };
    format!("The {kind} input is not valid because its 'coordinates' must be {what}.")
}

fn position(v: &Value, kind: &str) -> Result<Pos, String> {
    let Value::Array(items) = v else {
        return Err(shape(kind));
    };
    let numbers = items.iter().map(Value::as_f64).collect::<Option<Vec<_>>>();
    let Some(numbers) = numbers.filter(|n| (2..=3).contains(&n.len())) else {
        return Err(shape(kind));
    };
    let (lon, lat) = (numbers[0], numbers[1]);
    if !(-90.0..=90.0).contains(&lat) {
        return Err("Latitude values must be between -90 and 90 degrees.".to_owned());
    }
    if !(-180.0..=180.0).contains(&lon) {
        return Err("Longitude values must be between -180 and 180 degrees.".to_owned());
    }
    Ok(Pos { lon, lat })
}

fn positions(v: &Value, kind: &str) -> Result<Vec<Pos>, String> {
    match v {
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(|p| position(p, kind)).collect()
        }
        _ => Err(shape(kind)),
    }
}

/// A polygon's rings; `ring_number` counts rings from 1 across a MultiPolygon.
fn polygon(v: &Value, kind: &str, ring_number: &mut usize) -> Result<Vec<Ring>, String> {
    let Value::Array(rings) = v else {
        return Err(shape(kind));
    };
    if rings.is_empty() {
        return Err(format!(
            "The {kind} input is not valid because it has a polygon with no rings. Each polygon must have at least one ring."
        ));
    }
    rings
        .iter()
        .map(|r| {
            *ring_number += 1;
            let ring = positions(r, kind)?;
            if ring.len() < 4 {
                return Err(format!(
                    "The {kind} input is not valid because the ring number {ring_number} does not have enough points. Each ring of a polygon must contain at least four points."
                ));
            }
            if ring.first() != ring.last() {
                return Err(format!(
                    "The {kind} input is not valid because the start and end points of the ring number {ring_number} are not the same. Each ring of a polygon must have the same start and end points."
                ));
            }
            Ok(ring)
        })
        .collect()
}

/// The geometry in an argument, if it is a valid one.
fn geometry(v: &Val) -> Option<Geometry> {
    parse(v.json()?).ok()
}

/// A defined argument to validate as JSON: a number JSON cannot hold is judged as a number is.
fn to_validate(v: &Val) -> Option<std::borrow::Cow<'_, Value>> {
    match v {
        Val::Undefined => None,
        Val::Json(v) => Some(std::borrow::Cow::Borrowed(v)),
        Val::NonFinite(_) => Some(std::borrow::Cow::Owned(Value::from(0))),
    }
}

fn st_isvalid(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    Ok(to_validate(&args[0]).and_then(|v| boolean(parse(&v).is_ok())))
}

fn st_isvaliddetailed(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let Some(v) = to_validate(&args[0]) else {
        return Ok(None);
    };
    let v = &*v;
    let mut result = Map::new();
    match parse(v) {
        Ok(_) => {
            result.insert("valid".to_owned(), Value::Bool(true));
        }
        Err(reason) => {
            result.insert("valid".to_owned(), Value::Bool(false));
            result.insert("reason".to_owned(), Value::String(reason));
        }
    }
    Ok(Some(Value::Object(result)))
}

fn st_area(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let Some(g) = geometry(&args[0]) else {
        return Ok(None);
    };
    let Geometry::Polygons(polygons) = g else {
        return Ok(json_number(0.0));
    };
    let geodesic = Geodesic::wgs84();
    let earth = geodesic.area();
    let total: f64 = polygons
        .iter()
        .map(|rings| {
            let mut area = ring_region_area(&geodesic, &rings[0]);
            for hole in &rings[1..] {
                // The hole leaves out what lies outside its own region.
                area -= earth - ring_region_area(&geodesic, hole);
            }
            area.max(0.0)
        })
        .sum();
    Ok(json_number(total))
}

/// The area of the region left of a ring, in square meters (a clockwise ring: the rest of the
/// earth).
fn ring_region_area(geodesic: &Geodesic, ring: &Ring) -> f64 {
    let mut area = PolygonArea::new(geodesic, Winding::CounterClockwise);
    // The last position repeats the first; the polygon closes itself.
    for p in &ring[..ring.len() - 1] {
        area.add_point(p.lat, p.lon);
    }
    area.compute(false).1
}

fn st_distance(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (geometry(&args[0]), geometry(&args[1])) else {
        return Ok(None);
    };
    if let (Geometry::Point(p), Geometry::Point(q)) = (&a, &b) {
        return Ok(json_number(geodesic_distance(*p, *q)));
    }
    if intersects(&a, &b) {
        return Ok(json_number(0.0));
    }
    // The closest pair of points on the sphere, measured on the ellipsoid.
    let mut best: Option<(f64, Pos, Pos)> = None;
    let mut consider = |p: (Pos, Vec3), c: (Pos, Vec3), d: (Pos, Vec3)| {
        let (chord, q) = closest_on_arc(p.1, c, d);
        if best.is_none_or(|(b, _, _)| chord < b) {
            best = Some((chord, p.0, q));
        }
    };
    let on_sphere = |g: &Geometry| -> Vec<((Pos, Vec3), (Pos, Vec3))> {
        segments(g)
            .into_iter()
            .map(|(p, q)| ((p, unit(p)), (q, unit(q))))
            .collect()
    };
    let (sa, sb) = (on_sphere(&a), on_sphere(&b));
    for &(p, q) in &sa {
        for &(c, d) in &sb {
            consider(p, c, d);
            consider(q, c, d);
            consider(c, p, q);
            consider(d, p, q);
        }
    }
    Ok(best.and_then(|(_, p, q)| json_number(geodesic_distance(p, q))))
}

fn geodesic_distance(p: Pos, q: Pos) -> f64 {
    Geodesic::wgs84().inverse(p.lat, p.lon, q.lat, q.lon)
}

type Vec3 = [f64; 3];

fn unit(p: Pos) -> Vec3 {
    let (lat, lon) = (p.lat.to_radians(), p.lon.to_radians());
    [lat.cos() * lon.cos(), lat.cos() * lon.sin(), lat.sin()]
}

fn cross(a: Vec3, b: Vec3) -> Vec3 {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn dot(a: Vec3, b: Vec3) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

/// The squared chord between two unit vectors: it orders distances as the angle does.
fn chord2(a: Vec3, b: Vec3) -> f64 {
    let d = [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
    dot(d, d)
}

/// The point of the great-circle arc from `c` to `d` closest to the point at unit vector
/// `vp`, and its squared chord distance (the ends given with their unit vectors).
fn closest_on_arc(vp: Vec3, (c, vc): (Pos, Vec3), (d, vd): (Pos, Vec3)) -> (f64, Pos) {
    let (to_c, to_d) = ((chord2(vp, vc), c), (chord2(vp, vd), d));
    let nearer_end = if to_c.0 <= to_d.0 { to_c } else { to_d };
    let n = cross(vc, vd);
    let norm = dot(n, n).sqrt();
    if norm < 1e-15 {
        return nearer_end;
    }
    let n = [n[0] / norm, n[1] / norm, n[2] / norm];
    let off = dot(vp, n);
    let foot = [vp[0] - off * n[0], vp[1] - off * n[1], vp[2] - off * n[2]];
    let len = dot(foot, foot).sqrt();
    if len < 1e-15 {
        return nearer_end;
    }
    let foot = [foot[0] / len, foot[1] / len, foot[2] / len];
    // The foot lies on the arc if it is between c and d going the short way round.
    if dot(cross(vc, foot), n) < 0.0 || dot(cross(foot, vd), n) < 0.0 {
        return nearer_end;
    }
    let to_foot = chord2(vp, foot);
    if to_foot >= nearer_end.0 {
        return nearer_end;
    }
    let q = Pos {
        lat: foot[2].clamp(-1.0, 1.0).asin().to_degrees(),
        lon: foot[1].atan2(foot[0]).to_degrees(),
    };
    (to_foot, q)
}

/// A geometry's edges; a point is one edge of length 0.
fn segments(g: &Geometry) -> Vec<(Pos, Pos)> {
    match g {
        Geometry::Point(p) => vec![(*p, *p)],
        Geometry::LineString(points) => points.windows(2).map(|w| (w[0], w[1])).collect(),
        Geometry::Polygons(polygons) => polygons
            .iter()
            .flatten()
            .flat_map(|ring| ring.windows(2).map(|w| (w[0], w[1])))
            .collect(),
    }
}

fn vertices(g: &Geometry) -> Box<dyn Iterator<Item = Pos> + '_> {
    match g {
        Geometry::Point(p) => Box::new(std::iter::once(*p)),
        Geometry::LineString(points) => Box::new(points.iter().copied()),
        Geometry::Polygons(polygons) => Box::new(polygons.iter().flatten().flatten().copied()),
    }
}

/// Twice the signed area of the triangle `a b c` in degrees: positive when it turns left.
fn orient(a: Pos, b: Pos, c: Pos) -> f64 {
    (b.lon - a.lon) * (c.lat - a.lat) - (b.lat - a.lat) * (c.lon - a.lon)
}

/// Whether `p`, collinear with `a b`, lies within the segment's bounds.
fn within_bounds(p: Pos, a: Pos, b: Pos) -> bool {
    p.lon >= a.lon.min(b.lon)
        && p.lon <= a.lon.max(b.lon)
        && p.lat >= a.lat.min(b.lat)
        && p.lat <= a.lat.max(b.lat)
}

fn on_segment(p: Pos, (a, b): (Pos, Pos)) -> bool {
    orient(a, b, p) == 0.0 && within_bounds(p, a, b)
}

/// Whether two segments share a point (touching counts).
fn segments_meet((a, b): (Pos, Pos), (c, d): (Pos, Pos)) -> bool {
    if a == b {
        return on_segment(a, (c, d));
    }
    if c == d {
        return on_segment(c, (a, b));
    }
    let (o1, o2, o3, o4) = (
        orient(a, b, c),
        orient(a, b, d),
        orient(c, d, a),
        orient(c, d, b),
    );
    if o1 * o2 < 0.0 && o3 * o4 < 0.0 {
        return true;
    }
    (o1 == 0.0 && within_bounds(c, a, b))
        || (o2 == 0.0 && within_bounds(d, a, b))
        || (o3 == 0.0 && within_bounds(a, c, d))
        || (o4 == 0.0 && within_bounds(b, c, d))
}

/// Whether two segments cross at a point inside both (not at an end of either).
fn segments_cross((a, b): (Pos, Pos), (c, d): (Pos, Pos)) -> bool {
    orient(a, b, c) * orient(a, b, d) < 0.0 && orient(c, d, a) * orient(c, d, b) < 0.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    Inside,
    Boundary,
    Outside,
}

/// Where `p` lies relative to the region a ring encloses in the plane (even-odd rule).
fn enclosed(p: Pos, ring: &Ring) -> Location {
    let mut inside = false;
    for w in ring.windows(2) {
        let (a, b) = (w[0], w[1]);
        if on_segment(p, (a, b)) {
            return Location::Boundary;
        }
        if (a.lat > p.lat) != (b.lat > p.lat) {
            let lon = a.lon + (p.lat - a.lat) / (b.lat - a.lat) * (b.lon - a.lon);
            if p.lon < lon {
                inside = !inside;
            }
        }
    }
    if inside {
        Location::Inside
    } else {
        Location::Outside
    }
}

/// Whether a ring turns counter-clockwise in the plane (shoelace formula).
fn counter_clockwise(ring: &Ring) -> bool {
    let twice_area: f64 = ring
        .windows(2)
        .map(|w| w[0].lon * w[1].lat - w[1].lon * w[0].lat)
        .sum();
    twice_area > 0.0
}

/// Where `p` lies relative to the region left of a ring.
fn ring_region(p: Pos, ring: &Ring) -> Location {
    match (enclosed(p, ring), counter_clockwise(ring)) {
        (Location::Inside, false) => Location::Outside,
        (Location::Outside, false) => Location::Inside,
        (location, _) => location,
    }
}

/// Where `p` lies relative to polygons: a polygon is the region left of every ring.
fn locate(p: Pos, polygons: &[Vec<Ring>]) -> Location {
    let mut location = Location::Outside;
    for rings in polygons {
        let mut here = Location::Inside;
        for ring in rings {
            match ring_region(p, ring) {
                Location::Outside => {
                    here = Location::Outside;
                    break;
                }
                Location::Boundary => here = Location::Boundary,
                Location::Inside => {}
            }
        }
        match here {
            Location::Inside => return Location::Inside,
            Location::Boundary => location = Location::Boundary,
            Location::Outside => {}
        }
    }
    location
}

fn intersects(a: &Geometry, b: &Geometry) -> bool {
    let (sa, sb) = (segments(a), segments(b));
    if sa.iter().any(|&s| sb.iter().any(|&t| segments_meet(s, t))) {
        return true;
    }
    let covers = |outer: &Geometry, inner: &Geometry| match outer {
        Geometry::Polygons(polygons) => {
            vertices(inner).any(|p| locate(p, polygons) != Location::Outside)
        }
        _ => false,
    };
    covers(a, b) || covers(b, a)
}

/// Whether `a` lies within `b`.
fn within(a: &Geometry, b: &Geometry) -> bool {
    match b {
        Geometry::Point(q) => matches!(a, Geometry::Point(p) if p == q),
        Geometry::LineString(_) => {
            if matches!(a, Geometry::Polygons(_)) {
                return false;
            }
            let edges = segments(b);
            vertices(a).all(|p| edges.iter().any(|&e| on_segment(p, e)))
        }
        Geometry::Polygons(polygons) => {
            if let Geometry::Point(p) = a {
                return locate(*p, polygons) == Location::Inside;
            }
            if vertices(a).any(|p| locate(p, polygons) == Location::Outside) {
                return false;
            }
            let (sa, sb) = (segments(a), segments(b));
            if sa.iter().any(|&s| sb.iter().any(|&t| segments_cross(s, t))) {
                return false;
            }
            match a {
                // None of b's boundary may lie inside a (a hole of b, or b narrower).
                Geometry::Polygons(inner) => {
                    vertices(b).all(|p| locate(p, inner) != Location::Inside)
                }
                _ => true,
            }
        }
    }
}

fn st_within(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (geometry(&args[0]), geometry(&args[1])) else {
        return Ok(None);
    };
    Ok(boolean(within(&a, &b)))
}

fn st_intersects(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(a), Some(b)) = (geometry(&args[0]), geometry(&args[1])) else {
        return Ok(None);
    };
    Ok(boolean(intersects(&a, &b)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(
        f: fn(&Context, &[Val]) -> Result<Option<Value>, FunctionError>,
        args: Vec<Value>,
    ) -> Option<Value> {
        let args: Vec<Val> = args.into_iter().map(Val::Json).collect();
        f(&Context::new(0, 1), &args).expect("no error")
    }

    fn point(lon: f64, lat: f64) -> Value {
        json!({"type": "Point", "coordinates": [lon, lat]})
    }

    fn square(lon: f64, lat: f64, size: f64) -> Value {
        json!({"type": "Polygon", "coordinates": [[
            [lon, lat], [lon + size, lat], [lon + size, lat + size], [lon, lat + size], [lon, lat]
        ]]})
    }

    #[test]
    fn reference_distances_within_a_decimeter() {
        let reference = point(-122.11758113953535, 47.66901087006131);
        let hq = point(-122.12826822304672, 47.63980239335718);
        let rd = point(-96.84368664765994, 46.81297794314663);
        let d = |a: &Value| as_number(call(st_distance, vec![a.clone(), reference.clone()]));
        assert!((d(&hq) - 3345.269817267368).abs() < 0.001);
        assert!((d(&rd) - 1_907_438.421299902).abs() < 0.1);
    }

    fn as_number(v: Option<Value>) -> f64 {
        v.and_then(|v| v.as_f64()).expect("a number")
    }

    #[test]
    fn reference_area_and_orientation() {
        let ccw = json!({"type": "Polygon", "coordinates": [[
            [31.8, -5], [32, -5], [32, -4.7], [31.8, -4.7], [31.8, -5]
        ]]});
        let area = as_number(call(st_area, vec![ccw]));
        assert!((area - 735_970_283.0522614).abs() < 10.0, "{area}");
        // Clockwise: the rest of the earth.
        let cw = json!({"type": "Polygon", "coordinates": [[
            [31.8, -5], [31.8, -4.7], [32, -4.7], [32, -5], [31.8, -5]
        ]]});
        let rest = as_number(call(st_area, vec![cw]));
        assert!((rest + area - Geodesic::wgs84().area()).abs() < 1e3);
        assert_eq!(call(st_area, vec![point(1.0, 2.0)]), Some(json!(0)));
    }

    #[test]
    fn hole_is_left_out() {
        let holed = json!({"type": "Polygon", "coordinates": [
            [[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]],
            [[2, 2], [2, 4], [4, 4], [4, 2], [2, 2]]
        ]});
        let outer = as_number(call(st_area, vec![square(0.0, 0.0, 10.0)]));
        let hole = as_number(call(st_area, vec![square(2.0, 2.0, 2.0)]));
        let area = as_number(call(st_area, vec![holed.clone()]));
        assert!((outer - hole - area).abs() < 1e3);
        assert_eq!(
            call(st_within, vec![point(3.0, 3.0), holed.clone()]),
            boolean(false)
        );
        assert_eq!(call(st_within, vec![point(5.0, 5.0), holed]), boolean(true));
    }

    #[test]
    fn predicates() {
        let big = square(0.0, 0.0, 10.0);
        assert_eq!(
            call(st_within, vec![point(5.0, 5.0), big.clone()]),
            boolean(true)
        );
        assert_eq!(
            call(st_within, vec![point(15.0, 5.0), big.clone()]),
            boolean(false)
        );
        assert_eq!(
            call(st_within, vec![point(0.0, 5.0), big.clone()]),
            boolean(false)
        );
        assert_eq!(
            call(st_intersects, vec![point(0.0, 5.0), big.clone()]),
            boolean(true)
        );
        assert_eq!(
            call(st_within, vec![square(1.0, 1.0, 2.0), big.clone()]),
            boolean(true)
        );
        assert_eq!(
            call(st_within, vec![big.clone(), square(1.0, 1.0, 2.0)]),
            boolean(false)
        );
        assert_eq!(
            call(st_intersects, vec![square(9.0, 9.0, 2.0), big.clone()]),
            boolean(true)
        );
        assert_eq!(
            call(st_intersects, vec![square(20.0, 20.0, 2.0), big.clone()]),
            boolean(false)
        );
        let line = json!({"type": "LineString", "coordinates": [[-5, 5], [15, 5]]});
        assert_eq!(
            call(st_intersects, vec![line.clone(), big.clone()]),
            boolean(true)
        );
        assert_eq!(call(st_within, vec![line, big.clone()]), boolean(false));
        assert_eq!(
            call(st_distance, vec![point(5.0, 5.0), big]),
            Some(json!(0))
        );
    }

    #[test]
    fn distance_to_an_edge_is_perpendicular() {
        // One degree of latitude north of an edge along the equator: about 110.6 km.
        let d = as_number(call(
            st_distance,
            vec![point(5.0, -1.0), square(0.0, 0.0, 10.0)],
        ));
        assert!((d - 110_574.4).abs() < 1.0, "{d}");
        let line = json!({"type": "LineString", "coordinates": [[0, 0], [10, 0]]});
        let d = as_number(call(st_distance, vec![point(5.0, 1.0), line]));
        assert!((d - 110_574.4).abs() < 1.0, "{d}");
    }

    #[test]
    fn validity_and_reasons() {
        let reason =
            |v: Value| call(st_isvaliddetailed, vec![v]).expect("an object")["reason"].clone();
        assert_eq!(
            reason(point(133.75, -184.38)),
            json!("Latitude values must be between -90 and 90 degrees.")
        );
        assert_eq!(
            reason(point(200.0, 0.0)),
            json!("Longitude values must be between -180 and 180 degrees.")
        );
        let open = json!({"type": "Polygon", "coordinates": [[
            [31.8, -5], [31.8, -4.7], [32, -4.7], [32, -5]
        ]]});
        assert_eq!(
            reason(open),
            json!(
                "The Polygon input is not valid because the start and end points of the ring number 1 are not the same. Each ring of a polygon must have the same start and end points."
            )
        );
        assert_eq!(
            call(st_isvaliddetailed, vec![point(1.0, 2.0)]),
            Some(json!({"valid": true}))
        );
        for bad in [
            json!("x"),
            json!(1),
            json!(null),
            json!([]),
            json!({}),
            json!({"type": "Point"}),
            json!({"type": "Point", "coordinates": []}),
            json!({"type": "Point", "coordinates": [1]}),
            json!({"type": "Point", "coordinates": [1, "2"]}),
            json!({"type": "Point", "coordinates": [1, 2, 3, 4]}),
            json!({"type": "Circle", "coordinates": [1, 2]}),
            json!({"type": "LineString", "coordinates": [[1, 2]]}),
            json!({"type": "LineString", "coordinates": [[1, 2], [1, 2]]}),
            json!({"type": "LineString", "coordinates": [1, 2]}),
            json!({"type": "Polygon", "coordinates": []}),
            json!({"type": "Polygon", "coordinates": [[]]}),
            json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}),
            json!({"type": "MultiPolygon", "coordinates": []}),
            json!({"type": "MultiPolygon", "coordinates": [[[[[0, 0]]]]]}),
        ] {
            assert_eq!(call(st_isvalid, vec![bad.clone()]), boolean(false), "{bad}");
            assert_eq!(call(st_area, vec![bad.clone()]), None, "{bad}");
            assert_eq!(call(st_distance, vec![bad.clone(), point(0.0, 0.0)]), None);
            assert_eq!(call(st_within, vec![point(0.0, 0.0), bad.clone()]), None);
            assert_eq!(call(st_intersects, vec![bad.clone(), bad.clone()]), None);
        }
        assert_eq!(
            st_isvalid(&Context::new(0, 1), &[Val::Undefined]).expect("no error"),
            None
        );
        // Infinity and NaN are numbers: not geometries.
        assert_eq!(
            st_isvalid(&Context::new(0, 1), &[Val::NonFinite(f64::NAN)]).expect("no error"),
            Some(json!(false))
        );
    }

    #[test]
    fn cost_counts_positions() {
        let big = square(0.0, 0.0, 10.0);
        assert_eq!(positions_in(&Val::Json(point(1.0, 2.0))), 1);
        // The ring list, the ring, and five positions.
        assert_eq!(positions_in(&Val::Json(big.clone())), 7);
        assert_eq!(pair_cost(&[Val::Json(point(1.0, 2.0)), Val::Json(big)]), 16);
        assert_eq!(single_cost(&[Val::Json(json!("x"))]), 1);
        // Nesting deeper than a MultiPolygon's is not walked.
        let deep = json!({"type": "Point", "coordinates": [[[[[[[[1]]]]]]]]});
        assert_eq!(positions_in(&Val::Json(deep)), 5);
    }
}
