package platformsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

const metricsBase = "/metrics/v1"

func (s *Server) routeMetrics(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(s.requireScope(ScopeMetrics))
		r.Get(metricsBase+"/datasets", s.handleDatasets)
		r.Get(metricsBase+"/datasets/{name}", s.handleDataset)
		r.Post(metricsBase+"/datasets/{name}/data", s.handleData)
	})
}

func (s *Server) handleDatasets(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"@id":   metricsBase + "/datasets",
		"@type": "Collection",
		"items": s.datasets,
	})
}

func (s *Server) handleDataset(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	d, ok := s.dsByName[name]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "Not Found", fmt.Sprintf("No dataset named %q.", name), detail("name", "unknown dataset"))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// dataQuery is a validated data request.
type dataQuery struct {
	w          *world // the world the environment indexes refer to
	ds         *datasetDesc
	dims       []string
	metrics    []string
	filters    map[string][]string
	envIdx     []int
	start, end time.Time
	g          metricsapi.Granularity
	gSent      string
	echo       map[string]any
}

// defaultGranularity implements "without time_granularity the API picks the
// broadest one allowed for the range": the coarsest granularity whose longest
// range holds the range and whose bucket is not longer than the range;
// FIVE_MINUTES for ranges under five minutes. ok is false when the range is
// longer than any granularity allows (60 days).
func defaultGranularity(d time.Duration) (metricsapi.Granularity, bool) {
	gs := limits.Granularities
	if d > gs[len(gs)-1].MaxRange {
		return "", false
	}
	for i := len(gs) - 1; i >= 0; i-- {
		if d <= gs[i].MaxRange && d >= gs[i].Bucket {
			return metricsapi.Granularity(gs[i].Name), true
		}
	}
	return metricsapi.Granularity(gs[0].Name), true
}

func stringArray(raw json.RawMessage, source string, add func(source, desc string)) ([]string, bool) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		add(source, "must be an array of strings")
		return nil, false
	}
	out := make([]string, 0, len(items))
	ok := true
	for i, it := range items {
		var v string
		if err := json.Unmarshal(it, &v); err != nil || bytes.Equal(bytes.TrimSpace(it), []byte("null")) {
			add(fmt.Sprintf("%s[%d]", source, i), "must be a string, got "+string(it))
			ok = false
			continue
		}
		out = append(out, v)
	}
	return out, ok
}

func parseTime(raw json.RawMessage) (time.Time, error) {
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return time.Time{}, errors.New("must be an ISO 8601 date-time string")
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not an ISO 8601 date-time such as 2026-11-23T04:05:00Z", v)
	}
	return t.UTC(), nil
}

// parseQuery validates a data request body for dataset ds. It returns the
// query or every problem found as ErrorDetails.
func (s *Server) parseQuery(ds *datasetDesc, body []byte) (*dataQuery, []ErrorDetail) {
	top, bad := decodeQueryBody(body)
	if bad != nil {
		return nil, []ErrorDetail{*bad}
	}
	p := &queryParser{ds: ds, q: &dataQuery{w: s.w(), ds: ds, filters: map[string][]string{}, echo: map[string]any{}}}
	p.unknownProperties(top)
	p.metrics(top)
	p.dimensions(top)
	p.filters(top)
	rangeOK := p.dateRange(top)
	if p.granularity(top) && rangeOK {
		p.rangeFitsGranularity()
	}
	if len(p.details) > 0 {
		return p.q, p.details
	}
	return p.q, nil
}

// decodeQueryBody decodes a data request body into its top-level
// properties, or says why it cannot.
func decodeQueryBody(body []byte) (map[string]json.RawMessage, *ErrorDetail) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&top); err != nil || top == nil {
		msg := "the body must be a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		d := detail("body", msg)
		return nil, &d
	}
	if dec.More() {
		d := detail("body", "unexpected data after the JSON object")
		return nil, &d
	}
	return top, nil
}

// queryParser collects a data query and the problems of its request.
type queryParser struct {
	ds      *datasetDesc
	q       *dataQuery
	details []ErrorDetail
}

func (p *queryParser) add(source, desc string) { p.details = append(p.details, detail(source, desc)) }

func (p *queryParser) unknownProperties(top map[string]json.RawMessage) {
	known := map[string]bool{"date_range": true, "dimensions": true, "metrics": true, "filters": true, "time_granularity": true}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !known[k] {
			src := k
			if src == "" {
				src = `body[""]`
			}
			p.add(src, "unknown property (property names are case-sensitive): expected date_range, dimensions, metrics, filters, time_granularity")
		}
	}
}

func (p *queryParser) metrics(top map[string]json.RawMessage) {
	raw, ok := present(top, "metrics")
	if !ok {
		p.add("metrics", "required: a non-empty array of metric names")
		return
	}
	ms, ok := stringArray(raw, "metrics", p.add)
	if !ok {
		return
	}
	if len(ms) == 0 {
		p.add("metrics", "must not be empty")
	}
	ds := p.ds
	p.checkNames("metric", ms, func(m string) bool { return ds.metricI[m] != 0 || (len(ds.Metrics) > 0 && ds.Metrics[0].Name == m) })
	p.q.metrics = ms
	p.q.echo["metrics"] = ms
}

func (p *queryParser) dimensions(top map[string]json.RawMessage) {
	raw, ok := present(top, "dimensions")
	if !ok {
		p.q.echo["dimensions"] = []string{}
		return
	}
	dims, ok := stringArray(raw, "dimensions", p.add)
	if !ok {
		return
	}
	p.checkNames("dimension", dims, func(d string) bool { _, ok := p.ds.dimI[d]; return ok })
	p.q.dims = dims
	p.q.echo["dimensions"] = dims
}

// checkNames reports the names of a metrics or dimensions list that the
// dataset does not have, and those listed twice.
func (p *queryParser) checkNames(what string, names []string, known func(string) bool) {
	seen := map[string]bool{}
	for i, n := range names {
		src := fmt.Sprintf("%ss[%d]", what, i)
		switch {
		case !known(n):
			p.add(src, fmt.Sprintf("unknown %s %q of dataset %s", what, n, p.ds.Name))
		case seen[n]:
			p.add(src, fmt.Sprintf("%s %q is listed twice", what, n))
		}
		seen[n] = true
	}
}

func (p *queryParser) filters(top map[string]json.RawMessage) {
	raw, ok := present(top, "filters")
	if !ok {
		p.add("filters", "required: an object with at least the environment_id filter")
		return
	}
	var fm map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fm); err != nil {
		p.add("filters", "must be an object whose values are arrays of strings")
		return
	}
	names := make([]string, 0, len(fm))
	for k := range fm {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if vals, ok := p.filter(k, fm[k]); ok {
			p.q.filters[k] = vals
		}
	}
	if _, ok := fm["environment_id"]; !ok {
		p.add("filters.environment_id", "the environment_id filter is required")
	}
	p.q.echo["filters"] = p.q.filters
}

// filter checks one filter's values; false when it is left out of the
// query.
func (p *queryParser) filter(name string, raw json.RawMessage) ([]string, bool) {
	src := "filters." + name
	if _, ok := p.ds.filterI[name]; !ok {
		p.add(src, fmt.Sprintf("unknown filter %q of dataset %s", name, p.ds.Name))
		return nil, false
	}
	vals, ok := stringArray(raw, src, p.add)
	switch {
	case !ok:
		return nil, false
	case len(vals) == 0:
		p.add(src, "must hold at least one value")
		return nil, false
	case len(vals) > limits.MaxFilterValues:
		p.add(src, fmt.Sprintf("holds %d values; at most %d are allowed", len(vals), limits.MaxFilterValues))
		return nil, false
	}
	switch name {
	case "http_status_code":
		for i, v := range vals {
			if n, err := strconv.Atoi(v); err != nil || n < 100 || n > 599 {
				p.add(fmt.Sprintf("%s[%d]", src, i), fmt.Sprintf("%q is not an HTTP status code", v))
			}
		}
	case "environment_id":
		for i, v := range vals {
			idx, ok := p.q.w.envByID[v]
			if !ok {
				p.add(fmt.Sprintf("%s[%d]", src, i), fmt.Sprintf("unknown environment ID %q", v))
				continue
			}
			p.q.envIdx = append(p.q.envIdx, idx)
		}
	}
	return vals, true
}

// dateRange reads date_range; true when it is a valid range.
func (p *queryParser) dateRange(top map[string]json.RawMessage) bool {
	raw, ok := present(top, "date_range")
	if !ok {
		p.add("date_range", "required: an object with start and end")
		return false
	}
	var dr map[string]json.RawMessage
	if err := json.Unmarshal(raw, &dr); err != nil || dr == nil {
		p.add("date_range", "must be an object with start and end")
		return false
	}
	start, okS := p.rangeTime(dr, "start")
	end, okE := p.rangeTime(dr, "end")
	for k := range dr {
		if k != "start" && k != "end" {
			p.add("date_range."+k, "unknown property")
		}
	}
	if okS {
		p.q.start = start
	}
	if okE {
		p.q.end = end
	}
	if !okS || !okE {
		return false
	}
	p.q.echo["date_range"] = map[string]string{"start": ts(start), "end": ts(end)}
	if !start.Before(end) {
		p.add("date_range", "start must be before end (start inclusive, end exclusive)")
		return false
	}
	return true
}

// rangeTime reads date_range.start or .end.
func (p *queryParser) rangeTime(dr map[string]json.RawMessage, key string) (time.Time, bool) {
	v, ok := present(dr, key)
	if !ok {
		p.add("date_range."+key, "required")
		return time.Time{}, false
	}
	t, err := parseTime(v)
	if err != nil {
		p.add("date_range."+key, err.Error())
		return time.Time{}, false
	}
	return t, true
}

// granularity reads time_granularity; false when it is invalid.
func (p *queryParser) granularity(top map[string]json.RawMessage) bool {
	raw, ok := present(top, "time_granularity")
	if !ok {
		return true
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		p.add("time_granularity", "must be one of FIVE_MINUTES, HOUR, DAY")
		return false
	}
	if _, ok := granularity(metricsapi.Granularity(v)); !ok {
		p.add("time_granularity", fmt.Sprintf("%q is not one of FIVE_MINUTES, HOUR, DAY", v))
		return false
	}
	p.q.g, p.q.gSent = metricsapi.Granularity(v), v
	p.q.echo["time_granularity"] = v
	return true
}

// rangeFitsGranularity picks the default granularity, or checks the range
// against the one sent.
func (p *queryParser) rangeFitsGranularity() {
	q := p.q
	d := q.end.Sub(q.start)
	if q.g == "" {
		g, ok := defaultGranularity(d)
		if !ok {
			p.add("date_range", fmt.Sprintf("the range of %s is longer than any granularity allows (DAY: at most 60 days)", d))
		}
		q.g = g
	} else if gl, _ := granularity(q.g); d > gl.MaxRange {
		p.add("date_range", fmt.Sprintf("the range of %s is longer than %s allows (at most %s)", d, q.g, human(gl.MaxRange)))
	}
}

func human(d time.Duration) string {
	if d == 24*time.Hour {
		return "24 hours"
	}
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}

func (s *Server) handleData(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	ds, ok := s.dsByName[name]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "Not Found", fmt.Sprintf("No dataset named %q.", name), detail("name", "unknown dataset"))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "Unsupported Media Type",
				"The request body must be JSON (Content-Type: application/json).", detail("Content-Type", "got "+strconv.Quote(ct)))
			return
		}
	}
	at := s.now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "Bad Request", "Could not read the request body.", detail("body", err.Error()))
		return
	}
	q, details := s.parseQuery(ds, body)
	rec := DataRequest{Dataset: name, At: at}
	if q != nil {
		rec.Environments = q.filters["environment_id"]
		rec.Start, rec.End = q.start, q.end
		rec.Granularity, rec.GranularitySent = q.g, q.gSent
		rec.Dimensions, rec.Metrics = q.dims, q.metrics
		rec.Filters = q.filters
	}
	if details != nil {
		rec.Status = http.StatusBadRequest
		s.recordData(rec)
		writeError(w, http.StatusBadRequest, "invalid_query", "Bad Request",
			fmt.Sprintf("The data request for dataset %s is invalid: %s.", name, details[0].Description), details...)
		return
	}
	fields, rows, inj := s.execute(q, at)
	rec.Status, rec.Rows = http.StatusOK, len(rows)
	rec.BadValues, rec.MalformedRows = inj.badValues, inj.malformedRows
	s.recordData(rec)
	writeData(w, name, fields, rows, q.echo, at)
}

// writeData writes the data response. Rows are encoded by hand: a day of
// five-minute buckets for 20 environments is ~10^5 rows.
func writeData(w http.ResponseWriter, name string, fields []dataField, rows [][]byte, echo map[string]any, at time.Time) {
	fb, err1 := json.Marshal(fields)
	eb, err2 := json.Marshal(echo)
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "Internal Server Error", "encoding the response: "+err.Error())
		return
	}
	n := 256 + len(fb) + len(eb)
	for _, r := range rows {
		n += len(r) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"@id":`...)
	b = strconv.AppendQuote(b, metricsBase+"/datasets/"+name+"/data")
	b = append(b, `,"@type":"MetricsData","data_fields":`...)
	b = append(b, fb...)
	b = append(b, `,"data_rows":[`...)
	for i, r := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	b = append(b, `],"request":`...)
	b = append(b, eb...)
	b = append(b, `,"created_at":`...)
	b = strconv.AppendQuote(b, at.Format(time.RFC3339))
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

type dataField struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	DataType    string `json:"data_type"`
}

type group struct {
	t      time.Time
	env    int
	labels []string
	cell   cell
}

// buckets lists the bucket starts of g in [start, end) that have started by
// the time at and are within retention.
func buckets(g metricsapi.Granularity, start, end, at time.Time) []time.Time {
	d := bucketOf(g)
	first := truncate(g, start)
	if first.Before(start) {
		first = first.Add(d)
	}
	var keep time.Duration
	switch g {
	case "FIVE_MINUTES":
		keep = retentionFiveMinutes * time.Second
	case "HOUR":
		keep = retentionHour * time.Second
	default:
		keep = retentionDay * time.Second
	}
	oldest := at.Add(-keep)
	var out []time.Time
	for t := first; t.Before(end) && !t.After(at); t = t.Add(d) {
		if t.Add(d).Before(oldest) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// injected counts the data faults put into one answer.
type injected struct{ badValues, malformedRows int }

// execute computes the response rows of a valid query at time at, with the
// data faults configured, and counts those it injected.
//
// Aggregation of dimensions left out of the request: counts are summed;
// ratios are recomputed from the summed counts; per-second rates are summed
// counts over the seconds covered (the bucket, or without the time dimension
// every bucket of the range that has started); percentiles are the
// traffic-weighted mean of the leaves' percentiles (weights: edge requests
// for edge latencies, origin requests for origin latencies), which keeps them
// ordered by P and response time ≥ TTFB.
func (s *Server) execute(q *dataQuery, at time.Time) ([]dataField, [][]byte, injected) {
	fields := q.fields()
	gr := newGrouping(q)
	bs := buckets(q.g, q.start, q.end, at)
	groups := s.aggregate(q, gr, bs, at)
	seconds := bucketOf(q.g).Seconds()
	if !gr.withTime {
		seconds *= float64(len(bs))
	}
	s.mu.Lock()
	seed := s.rng.Uint64()
	f := s.faults
	s.mu.Unlock()
	rw := &rowWriter{s: s, q: q, faults: f, rng: rand.New(rand.NewPCG(seed, 7)), seconds: seconds, width: len(fields)}
	rows := make([][]byte, 0, len(groups.order))
	for _, key := range groups.order {
		rows = append(rows, rw.row(key, groups.byKey[key]))
	}
	rw.rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	return fields, rows, rw.inj
}

// fields returns the data fields of the answer to q: its dimensions, then
// its metrics.
func (q *dataQuery) fields() []dataField {
	ds := q.ds
	var fields []dataField
	for _, d := range q.dims {
		dd := ds.Dimensions[ds.dimI[d]]
		fields = append(fields, dataField{Name: d, Description: dd.Description, DataType: dd.Type})
	}
	for _, m := range q.metrics {
		md := ds.Metrics[ds.metricI[m]]
		fields = append(fields, dataField{Name: m, Description: md.Description, DataType: md.Type})
	}
	return fields
}

// grouping is how execute groups the leaves of a query's buckets: by the
// dimensions requested, keeping the leaves the label filters let through.
type grouping struct {
	withTime, withEnv bool
	labelPos          []int // label index per requested non-time, non-env dimension
	filters           []labelFilter
}

// labelFilter is an optional filter on the label at position pos.
type labelFilter struct {
	pos  int
	vals map[string]bool
}

// newGrouping returns the grouping of q.
func newGrouping(q *dataQuery) grouping {
	var gr grouping
	for name, vals := range q.filters {
		if name == "environment_id" {
			continue
		}
		if i := slices.Index(q.ds.labels, name); i >= 0 {
			set := map[string]bool{}
			for _, v := range vals {
				set[v] = true
			}
			gr.filters = append(gr.filters, labelFilter{i, set})
		}
	}
	for _, d := range q.dims {
		switch d {
		case "time":
			gr.withTime = true
		case "environment_id":
			gr.withEnv = true
		default:
			if i := slices.Index(q.ds.labels, d); i >= 0 {
				gr.labelPos = append(gr.labelPos, i)
			}
		}
	}
	return gr
}

// keep reports whether the leaf lv passes every label filter.
func (gr *grouping) keep(lv *leaf) bool {
	for _, f := range gr.filters {
		if !f.vals[lv.labels[f.pos]] {
			return false
		}
	}
	return true
}

// key returns the key of the group of leaf lv of environment env's bucket
// t, written with kb.
func (gr *grouping) key(kb *strings.Builder, t time.Time, env int, lv *leaf) string {
	kb.Reset()
	if gr.withTime {
		kb.WriteString(strconv.FormatInt(t.Unix(), 10))
	}
	kb.WriteByte(0)
	if gr.withEnv {
		kb.WriteString(strconv.Itoa(env))
	}
	for _, p := range gr.labelPos {
		kb.WriteByte(0)
		kb.WriteString(lv.labels[p])
	}
	return kb.String()
}

// groupSet holds the groups of an answer by key, in the order they were
// first seen.
type groupSet struct {
	byKey map[string]*group
	order []string
}

// aggregate adds up the leaves of the buckets bs of every environment of q
// (a repeated environment counts once) into the groups of gr.
func (s *Server) aggregate(q *dataQuery, gr grouping, bs []time.Time, at time.Time) groupSet {
	groups := groupSet{byKey: map[string]*group{}}
	seen := map[int]bool{}
	var kb strings.Builder
	for _, env := range q.envIdx {
		if seen[env] {
			continue
		}
		seen[env] = true
		for _, t := range bs {
			b := s.bucket(q.w, env, q.g, t, at)
			for _, lv := range b.leaves(q.ds.Name) {
				if gr.keep(&lv) {
					groups.add(gr.key(&kb, t, env, &lv), t, env, &lv, gr.labelPos)
				}
			}
		}
	}
	return groups
}

// add adds leaf lv of environment env's bucket t to the group key,
// creating it with the labels at labelPos.
func (gs *groupSet) add(key string, t time.Time, env int, lv *leaf, labelPos []int) {
	g := gs.byKey[key]
	if g == nil {
		g = &group{t: t, env: env}
		for _, p := range labelPos {
			g.labels = append(g.labels, lv.labels[p])
		}
		gs.byKey[key] = g
		gs.order = append(gs.order, key)
	}
	g.cell.add(&lv.cell)
}

// rowWriter encodes the rows of one answer to q, injecting the data faults
// with rng and counting them in inj.
type rowWriter struct {
	s       *Server
	q       *dataQuery
	faults  Faults
	rng     *rand.Rand
	seconds float64 // the seconds per-second rates are over
	width   int     // values per row
	inj     injected
}

// row encodes group g (of key key) as a data row.
func (rw *rowWriter) row(key string, g *group) []byte {
	s := rw.s
	asStrings := s.cfg.Numbers == NumbersAsStrings ||
		(s.cfg.Numbers == NumbersMixed && s.hash.s("strings").s(key).u() < 1.0/7)
	row := make([]byte, 0, 64+16*rw.width)
	row = append(row, '[')
	row, lastComma := rw.appendDimensions(row, g, asStrings)
	row, lastComma = rw.appendMetrics(row, g, asStrings, lastComma)
	row = append(row, ']')
	if rw.faults.MalformedRowRate > 0 && rw.rng.Float64() < rw.faults.MalformedRowRate {
		row = malformed(row, lastComma, rw.rng.IntN(3))
		rw.inj.malformedRows++
	}
	return row
}

// appendDimensions appends the values of g's dimensions and returns where
// the last one starts, less one (-1 for one value or none).
func (rw *rowWriter) appendDimensions(row []byte, g *group, asStrings bool) (_ []byte, lastComma int) {
	q, ds := rw.q, rw.q.ds
	lastComma = -1
	li := 0
	for i, d := range q.dims {
		if i > 0 {
			lastComma = len(row)
			row = append(row, ',')
		}
		switch d {
		case "time":
			row = strconv.AppendQuote(row, g.t.UTC().Format(time.RFC3339))
		case "environment_id":
			row = strconv.AppendQuote(row, q.w.envs[g.env].ID)
		default:
			v := g.labels[li]
			li++
			if ds.Dimensions[ds.dimI[d]].Type == "NUMBER" && !asStrings {
				row = append(row, v...)
			} else {
				row = strconv.AppendQuote(row, v)
			}
		}
	}
	return row, lastComma
}

// appendMetrics appends the values of g's metrics (or the bad values that
// replace some) and returns where the last value starts, less one.
func (rw *rowWriter) appendMetrics(row []byte, g *group, asStrings bool, lastComma int) ([]byte, int) {
	q, f := rw.q, rw.faults
	for i, m := range q.metrics {
		if i > 0 || len(q.dims) > 0 {
			lastComma = len(row)
			row = append(row, ',')
		}
		if f.BadValues != "" && rw.rng.Float64() < f.BadValueRate && (f.BadValues != BadNegative || strings.HasSuffix(m, "_total")) {
			row = append(row, f.BadValues.literal()...)
			rw.inj.badValues++
			continue
		}
		row = appendNumber(row, m, g.cell.value(m, rw.seconds), asStrings)
	}
	return row, lastComma
}

// malformed turns a row into a malformed one of the given kind: 0 drops its
// last value, 1 adds a value, 2 makes it an object. lastComma is the index
// of the comma before the last value (-1: the row has one value or none).
func malformed(row []byte, lastComma, kind int) []byte {
	switch kind {
	case 0:
		if lastComma < 0 {
			return []byte("[]")
		}
		return append(row[:lastComma:lastComma], ']')
	case 1:
		return append(row[:len(row)-1], `,"unexpected"]`...)
	}
	return []byte(`{"row":` + string(row) + `}`)
}

// DatasetNames lists the six datasets in descriptor order.
func (s *Server) DatasetNames() []string {
	out := make([]string, len(s.datasets))
	for i, d := range s.datasets {
		out[i] = d.Name
	}
	return out
}

// DatasetLabels returns the label dimensions (all but time and
// environment_id) of a dataset in descriptor order: the order of Row.Labels
// from Rows.
func (s *Server) DatasetLabels(dataset string) []string {
	if d, ok := s.dsByName[dataset]; ok {
		return append([]string(nil), d.labels...)
	}
	return nil
}

// DatasetMetrics returns the metric names of a dataset in descriptor order:
// the order of Row.Values from Rows.
func (s *Server) DatasetMetrics(dataset string) []string {
	d, ok := s.dsByName[dataset]
	if !ok {
		return nil
	}
	out := make([]string, len(d.Metrics))
	for i, m := range d.Metrics {
		out[i] = m.Name
	}
	return out
}

// Rows is the ground truth for tests: exactly the rows the data endpoint
// returns without data faults (Faults.BadValues, MalformedRowRate), with
// every dimension and every metric requested, for one environment,
// granularity g and range [start, end), asked at time at (for the late-data
// effect). Labels follow DatasetLabels, Values DatasetMetrics,
// values rounded exactly as on the wire. Rows are sorted by time, then labels.
func (s *Server) Rows(dataset, env string, g metricsapi.Granularity, start, end, at time.Time) ([]metricsapi.Row, error) {
	ds, ok := s.dsByName[dataset]
	if !ok {
		return nil, fmt.Errorf("platformsim: unknown dataset %q", dataset)
	}
	wd := s.w()
	idx, ok := wd.envByID[env]
	if !ok {
		return nil, fmt.Errorf("platformsim: unknown environment %q", env)
	}
	if _, ok := granularity(g); !ok {
		return nil, fmt.Errorf("platformsim: unknown granularity %q", g)
	}
	metrics := s.DatasetMetrics(dataset)
	var out []metricsapi.Row
	for _, t := range buckets(g, start.UTC(), end.UTC(), at.UTC()) {
		b := s.bucket(wd, idx, g, t, at.UTC())
		for _, lv := range b.leaves(ds.Name) {
			row := metricsapi.Row{Time: t, Environment: env, Labels: lv.labels, Values: make([]float64, len(metrics))}
			for i, m := range metrics {
				row.Values[i] = roundValue(m, lv.cell.value(m, bucketOf(g).Seconds()))
			}
			out = append(out, row)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.Before(out[j].Time)
		}
		return strings.Join(out[i].Labels, "\x00") < strings.Join(out[j].Labels, "\x00")
	})
	return out, nil
}
