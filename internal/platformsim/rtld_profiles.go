package platformsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// Limits of an RTLD access-log profile (spec 2.9 and 8).
const (
	maxProfileName     = 36
	maxDescription     = 1024
	maxCustomItems     = 250
	maxDestinationURL  = 1024
	maxProfileBodySize = 1 << 20
)

// Delivery-method values the simulator accepts (platform notes, "RTLD
// http_post delivery").
const (
	deliveryHTTPPost         = "http_post"
	authHTTPBasic            = "http_basic"
	authCustomAuthentication = "custom_authentication"
	formatJSON               = "json"
	formatJSONArray          = "json_array"
	formatJSONLines          = "json_lines"
	formatCSV                = "csv"
)

var (
	headerNameRE = regexp.MustCompile(`^[a-zA-Z0-9-]+$`)
	statusCodeRE = regexp.MustCompile(`^[1-5]([0-9]{2}|xx)$`)
	logFormats   = []string{formatJSON, formatJSONArray, formatJSONLines, formatCSV}
	// downsamplingValues is the enum of downsampling_percent (spec 2.9).
	downsamplingValues = []float64{0.1, 1, 25, 50, 75}
)

// rtldProfile is a stored access-log profile. Secrets (password, token) are
// kept for delivery and never rendered.
type rtldProfile struct {
	ID                    int64
	EnvironmentID         string
	Name                  string
	Description           *string
	Enabled               bool
	DownsamplingPercent   *float64
	Fields                []string
	CustomCookies         []string
	CustomRequestHeaders  []string
	CustomResponseHeaders []string
	Filters               *rtldFilters
	Delivery              rtldDelivery
	CreatedAt             time.Time
	UpdatedAt             time.Time
}

// rtldFilters is a profile's filters object (spec 2.9).
type rtldFilters struct {
	StatusCodes []string       `json:"status_codes,omitempty"`
	HostNames   *rtldHostNames `json:"host_names,omitempty"`
}

// rtldHostNames restricts delivery to (condition "in") or away from
// (condition "not_in") a list of hosts.
type rtldHostNames struct {
	Names     []string `json:"names"`
	Condition string   `json:"condition"`
}

// rtldDelivery is a profile's delivery_method.
type rtldDelivery struct {
	Type                string
	DestinationEndpoint string
	LogFormat           string
	AuthType            string // "" when no authentication is configured
	Username            string
	Password            string // write-only
	Token               string // write-only (custom_authentication)
}

// rtldDetail is one ErrorDetail of a 400 answer: the request part at fault
// (a dotted body path such as "delivery_method.destination_endpoint", an
// indexed element such as "fields[3]", or a query parameter name) and what is
// wrong with it.
type rtldDetail struct {
	Source      string
	Description string
}

// rtldError is an RTLD error answer before rendering as the spec's Error
// object.
type rtldError struct {
	Status      int
	Code        string
	Title       string
	Description string
	Details     []rtldDetail
}

func (f *rtldError) Error() string {
	return fmt.Sprintf("%d %s: %s", f.Status, f.Code, f.Description)
}

func badRequest(description string, details ...rtldDetail) *rtldError {
	return &rtldError{Status: http.StatusBadRequest, Code: "bad_request", Title: "Bad Request", Description: description, Details: details}
}

func rtldNotFound(description string) *rtldError {
	return &rtldError{Status: http.StatusNotFound, Code: "not_found", Title: "Not Found", Description: description}
}

// profileValidator checks a create or update body field by field, collecting
// every problem with its source so one answer names them all.
type profileValidator struct {
	details []rtldDetail
}

func (v *profileValidator) fail(source, format string, args ...any) {
	v.details = append(v.details, rtldDetail{Source: source, Description: fmt.Sprintf(format, args...)})
}

func (v *profileValidator) failed() bool { return len(v.details) > 0 }

// decodeProfile parses and validates a create or update body (spec 2.9).
// envKnown reports whether an environment ID exists. Read-only properties a
// client may echo back from a GET (@id, @type, id) are ignored; any other
// unknown property is an error.
func decodeProfile(body []byte, envKnown func(string) bool) (rtldProfile, *rtldError) {
	raw, ferr := decodeObject(body)
	if ferr != nil {
		return rtldProfile{}, ferr
	}
	v := &profileValidator{}
	v.unknownProperties(raw)
	// Checked in this order (Go calls the literal's functions left to
	// right), which is the order of the answer's details.
	p := rtldProfile{
		EnvironmentID:       v.environmentID(raw, envKnown),
		Name:                v.profileName(raw),
		Description:         v.description(raw),
		Enabled:             v.enabled(raw),
		DownsamplingPercent: v.downsamplingPercent(raw),
		Fields:              v.fields(raw),
		// custom_cookies, custom_request_headers, custom_response_headers.
		CustomCookies:         v.customList(raw, "custom_cookies", nil),
		CustomRequestHeaders:  v.customList(raw, "custom_request_headers", headerNameRE),
		CustomResponseHeaders: v.customList(raw, "custom_response_headers", headerNameRE),
	}
	if r, ok := present(raw, "filters"); ok {
		p.Filters = v.filters(r)
	}
	// delivery_method: required.
	if r, ok := present(raw, "delivery_method"); !ok {
		v.fail("delivery_method", "is required")
	} else {
		p.Delivery = v.delivery(r)
	}
	if v.failed() {
		return rtldProfile{}, badRequest("the profile is invalid", v.details...)
	}
	return p, nil
}

// decodeObject decodes a body that must be one JSON object, keeping its
// numbers as they are written.
func decodeObject(body []byte) (map[string]json.RawMessage, *rtldError) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil || raw == nil {
		desc := "request body must be a JSON object"
		if err != nil {
			desc += ": " + err.Error()
		}
		return nil, badRequest(desc, rtldDetail{Source: "body", Description: desc})
	}
	if dec.More() {
		return nil, badRequest("request body has data after the JSON object", rtldDetail{Source: "body", Description: "trailing data after the JSON object"})
	}
	return raw, nil
}

// profileProperties are the properties of a profile a body may hold.
var profileProperties = map[string]bool{"@id": true, "@type": true, "id": true, "environment_id": true, "profile_name": true,
	"description": true, "enabled": true, "downsampling_percent": true, "fields": true, "custom_cookies": true,
	"custom_request_headers": true, "custom_response_headers": true, "filters": true, "delivery_method": true,
	"created_at": true, "updated_at": true}

// unknownProperties fails every property of raw a profile does not have,
// in name order.
func (v *profileValidator) unknownProperties(raw map[string]json.RawMessage) {
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if !profileProperties[k] {
			v.fail(k, "unknown property %q", k)
		}
	}
}

// environmentID checks environment_id: required, a UUID of a known
// environment.
func (v *profileValidator) environmentID(raw map[string]json.RawMessage, envKnown func(string) bool) string {
	s, ok := v.requiredString(raw, "environment_id")
	if !ok {
		return ""
	}
	switch {
	case !isUUID(s):
		v.fail("environment_id", "must be a UUID")
	case !envKnown(s):
		v.fail("environment_id", "unknown environment %q", s)
	default:
		return s
	}
	return ""
}

// profileName checks profile_name: required, 1..36 characters.
func (v *profileValidator) profileName(raw map[string]json.RawMessage) string {
	s, ok := v.requiredString(raw, "profile_name")
	if !ok {
		return ""
	}
	switch n := utf8.RuneCountInString(s); {
	case strings.TrimSpace(s) == "":
		v.fail("profile_name", "must not be empty")
	case n > maxProfileName:
		v.fail("profile_name", "must be at most %d characters (got %d)", maxProfileName, n)
	default:
		return s
	}
	return ""
}

// description checks description: optional, 1..1024 characters.
func (v *profileValidator) description(raw map[string]json.RawMessage) *string {
	r, ok := present(raw, "description")
	if !ok {
		return nil
	}
	var s string
	if json.Unmarshal(r, &s) != nil {
		v.fail("description", "must be a string")
	} else if n := utf8.RuneCountInString(s); n < 1 || n > maxDescription {
		v.fail("description", "must be 1 to %d characters (got %d)", maxDescription, n)
	} else {
		return &s
	}
	return nil
}

// enabled checks enabled: optional boolean, false when omitted.
func (v *profileValidator) enabled(raw map[string]json.RawMessage) bool {
	var enabled bool
	if r, ok := present(raw, "enabled"); ok {
		if json.Unmarshal(r, &enabled) != nil {
			v.fail("enabled", "must be a boolean")
		}
	}
	return enabled
}

// downsamplingPercent checks downsampling_percent: optional enum; null or
// omitted disables it.
func (v *profileValidator) downsamplingPercent(raw map[string]json.RawMessage) *float64 {
	r, ok := present(raw, "downsampling_percent")
	if !ok {
		return nil
	}
	var f float64
	switch {
	case json.Unmarshal(r, &f) != nil:
		v.fail("downsampling_percent", "must be a number")
	case !slices.ContainsFunc(downsamplingValues, func(x float64) bool { return math.Abs(x-f) < 1e-9 }):
		v.fail("downsampling_percent", "must be one of 0.1, 1, 25, 50, 75 (got %v)", f)
	default:
		return &f
	}
	return nil
}

// fields checks fields: required, non-empty, unique, known codes.
func (v *profileValidator) fields(raw map[string]json.RawMessage) []string {
	r, ok := present(raw, "fields")
	if !ok {
		v.fail("fields", "is required")
		return nil
	}
	list, ok := v.stringList(r, "fields")
	if !ok {
		return nil
	}
	if len(list) == 0 {
		v.fail("fields", "must contain at least one field code")
	}
	seen := map[string]bool{}
	for i, code := range list {
		src := fmt.Sprintf("fields[%d]", i)
		switch {
		case seen[code]:
			v.fail(src, "duplicate field code %q", code)
		case !isKnownField(code):
			v.fail(src, "unknown field code %q (see GET /rtld/v1/accesslogs/fields)", code)
		}
		seen[code] = true
	}
	return list
}

// present returns the raw value of key unless it is absent or null.
func present(raw map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	r, ok := raw[key]
	if !ok || string(bytes.TrimSpace(r)) == "null" {
		return nil, false
	}
	return r, true
}

func (v *profileValidator) requiredString(raw map[string]json.RawMessage, key string) (string, bool) {
	return v.requiredStringAt(raw, key, key)
}

func (v *profileValidator) requiredStringAt(raw map[string]json.RawMessage, key, source string) (string, bool) {
	r, ok := present(raw, key)
	if !ok {
		v.fail(source, "is required")
		return "", false
	}
	var s string
	if json.Unmarshal(r, &s) != nil {
		v.fail(source, "must be a string")
		return "", false
	}
	return s, true
}

func (v *profileValidator) stringList(r json.RawMessage, source string) ([]string, bool) {
	var items []json.RawMessage
	if json.Unmarshal(r, &items) != nil {
		v.fail(source, "must be an array of strings")
		return nil, false
	}
	out := make([]string, 0, len(items))
	ok := true
	for i, it := range items {
		var s string
		if json.Unmarshal(it, &s) != nil {
			v.fail(fmt.Sprintf("%s[%d]", source, i), "must be a string")
			ok = false
			continue
		}
		out = append(out, s)
	}
	return out, ok
}

// customList validates an optional list of 1 to 250 unique names; pattern,
// when set, is the rule every item must match.
func (v *profileValidator) customList(raw map[string]json.RawMessage, key string, pattern *regexp.Regexp) []string {
	r, ok := present(raw, key)
	if !ok {
		return nil
	}
	list, ok := v.stringList(r, key)
	if !ok {
		return nil
	}
	if len(list) < 1 || len(list) > maxCustomItems {
		v.fail(key, "must contain 1 to %d items (got %d)", maxCustomItems, len(list))
	}
	seen := map[string]bool{}
	for i, s := range list {
		src := fmt.Sprintf("%s[%d]", key, i)
		low := strings.ToLower(s)
		switch {
		case s == "":
			v.fail(src, "must not be empty")
		case pattern != nil && !pattern.MatchString(s):
			v.fail(src, "%q does not match %s", s, pattern.String())
		case pattern == nil && !validCookieName(s):
			v.fail(src, "%q is not a valid cookie name", s)
		case seen[low]:
			v.fail(src, "duplicate item %q", s)
		}
		seen[low] = true
	}
	return list
}

// validCookieName accepts an RFC 6265 cookie-name token.
func validCookieName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= 0x20 || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
}

// object decodes r as a JSON object, failing source when it is not one.
func (v *profileValidator) object(r json.RawMessage, source string) (map[string]json.RawMessage, bool) {
	var raw map[string]json.RawMessage
	if json.Unmarshal(r, &raw) != nil || raw == nil {
		v.fail(source, "must be an object")
		return nil, false
	}
	return raw, true
}

func (v *profileValidator) filters(r json.RawMessage) *rtldFilters {
	raw, ok := v.object(r, "filters")
	if !ok {
		return nil
	}
	f := &rtldFilters{}
	for k := range raw {
		if k != "status_codes" && k != "host_names" {
			v.fail("filters."+k, "unknown filter %q", k)
		}
	}
	if sr, ok := present(raw, "status_codes"); ok {
		f.StatusCodes = v.statusCodes(sr)
	}
	if hr, ok := present(raw, "host_names"); ok {
		f.HostNames = v.hostNames(hr)
	}
	return f
}

// statusCodes checks filters.status_codes: status codes (404) and classes
// (2xx), at least one.
func (v *profileValidator) statusCodes(r json.RawMessage) []string {
	list, ok := v.stringList(r, "filters.status_codes")
	if !ok {
		return nil
	}
	if len(list) == 0 {
		v.fail("filters.status_codes", "must not be empty")
	}
	for i, s := range list {
		if !statusCodeRE.MatchString(s) {
			v.fail(fmt.Sprintf("filters.status_codes[%d]", i), "%q is neither a status code (404) nor a class (2xx)", s)
		}
	}
	return list
}

// hostNames checks filters.host_names: an object with the names (at least
// one) and the condition, in or not_in.
func (v *profileValidator) hostNames(r json.RawMessage) *rtldHostNames {
	h, ok := v.object(r, "filters.host_names")
	if !ok {
		return nil
	}
	hn := &rtldHostNames{}
	if nr, ok := present(h, "names"); !ok {
		v.fail("filters.host_names.names", "is required")
	} else if list, ok := v.stringList(nr, "filters.host_names.names"); ok {
		if len(list) == 0 {
			v.fail("filters.host_names.names", "must not be empty")
		}
		hn.Names = list
	}
	if c, ok := v.requiredStringAt(h, "condition", "filters.host_names.condition"); ok {
		if c != "in" && c != "not_in" {
			v.fail("filters.host_names.condition", "must be \"in\" or \"not_in\" (got %q)", c)
		}
		hn.Condition = c
	}
	return hn
}

func (v *profileValidator) delivery(r json.RawMessage) rtldDelivery {
	var d rtldDelivery
	raw, ok := v.object(r, "delivery_method")
	if !ok {
		return d
	}
	if t, ok := v.requiredStringAt(raw, "type", "delivery_method.type"); ok {
		if t != deliveryHTTPPost {
			v.fail("delivery_method.type", "unsupported delivery type %q (the simulator delivers %q)", t, deliveryHTTPPost)
		}
		d.Type = t
	}
	if u, ok := v.requiredStringAt(raw, "destination_endpoint", "delivery_method.destination_endpoint"); ok {
		switch {
		case !strings.HasPrefix(u, "https://") || len(u) <= len("https://"):
			v.fail("delivery_method.destination_endpoint", "must be an https:// URL")
		case len(u) > maxDestinationURL:
			v.fail("delivery_method.destination_endpoint", "must be at most %d characters (got %d)", maxDestinationURL, len(u))
		}
		d.DestinationEndpoint = u
	}
	if f, ok := v.requiredStringAt(raw, "log_format", "delivery_method.log_format"); ok {
		if !slices.Contains(logFormats, f) {
			v.fail("delivery_method.log_format", "must be one of %s (got %q)", strings.Join(logFormats, ", "), f)
		}
		d.LogFormat = f
	}
	if ar, ok := present(raw, "authentication"); ok {
		v.authentication(ar, &d)
	}
	return d
}

// authentication checks delivery_method.authentication, an object of type
// http_basic (username, password) or custom_authentication (token), and
// sets it in d.
func (v *profileValidator) authentication(r json.RawMessage, d *rtldDelivery) {
	a, ok := v.object(r, "delivery_method.authentication")
	if !ok {
		return
	}
	t, ok := v.requiredStringAt(a, "type", "delivery_method.authentication.type")
	if !ok {
		return
	}
	d.AuthType = t
	switch t {
	case authHTTPBasic:
		d.Username = v.nonEmpty(a, "username")
		d.Password = v.nonEmpty(a, "password")
	case authCustomAuthentication:
		d.Token = v.nonEmpty(a, "token")
	default:
		v.fail("delivery_method.authentication.type", "must be %q or %q (got %q)", authHTTPBasic, authCustomAuthentication, t)
	}
}

// nonEmpty checks that the authentication's key is a string that is not
// empty (and, for the username, has no colon), and returns it.
func (v *profileValidator) nonEmpty(a map[string]json.RawMessage, key string) string {
	source := "delivery_method.authentication." + key
	s, ok := v.requiredStringAt(a, key, source)
	if !ok {
		return ""
	}
	switch {
	case key == "username" && (s == "" || strings.Contains(s, ":")):
		v.fail(source, "must be non-empty and contain no colon")
	case s == "":
		v.fail(source, "must not be empty")
	}
	return s
}

func isKnownField(code string) bool {
	_, ok := accesslog.LookupField(code)
	return ok
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// profileStore holds the simulator's RTLD profiles. It is safe for
// concurrent use; name uniqueness is checked and enforced under one lock, so
// two racing creates of the same name leave exactly one profile.
type profileStore struct {
	mu     sync.Mutex
	nextID int64
	byID   map[int64]*rtldProfile
	now    func() time.Time
}

func newProfileStore(now func() time.Time) *profileStore {
	return &profileStore{nextID: 4101, byID: map[int64]*rtldProfile{}, now: now}
}

func (st *profileStore) nameTaken(env, name string, except int64) bool {
	for id, p := range st.byID {
		if id != except && p.EnvironmentID == env && p.Name == name {
			return true
		}
	}
	return false
}

func nameNotUnique(name string) *rtldError {
	return badRequest("profile_name is not unique",
		rtldDetail{Source: "profile_name", Description: fmt.Sprintf("a profile named %q already exists in this environment", name)})
}

func (st *profileStore) create(p rtldProfile) (rtldProfile, *rtldError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.nameTaken(p.EnvironmentID, p.Name, 0) {
		return rtldProfile{}, nameNotUnique(p.Name)
	}
	p.ID = st.nextID
	st.nextID++
	p.CreatedAt = st.now().UTC()
	p.UpdatedAt = p.CreatedAt
	cp := p.clone()
	st.byID[p.ID] = &cp
	return p.clone(), nil
}

// update replaces the profile id of environment p.EnvironmentID (PUT is a
// full replacement: the body carries the password again).
func (st *profileStore) update(id int64, p rtldProfile) (rtldProfile, *rtldError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.byID[id]
	if !ok || old.EnvironmentID != p.EnvironmentID {
		return rtldProfile{}, rtldNotFound(fmt.Sprintf("no profile %d in environment %s", id, p.EnvironmentID))
	}
	if st.nameTaken(p.EnvironmentID, p.Name, id) {
		return rtldProfile{}, nameNotUnique(p.Name)
	}
	p.ID = id
	p.CreatedAt = old.CreatedAt
	p.UpdatedAt = st.now().UTC()
	cp := p.clone()
	st.byID[id] = &cp
	return p.clone(), nil
}

func (st *profileStore) get(env string, id int64) (rtldProfile, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.byID[id]
	if !ok || p.EnvironmentID != env {
		return rtldProfile{}, false
	}
	return p.clone(), true
}

func (st *profileStore) remove(env string, id int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.byID[id]
	if !ok || p.EnvironmentID != env {
		return false
	}
	delete(st.byID, id)
	return true
}

// list returns the profiles of env ("" for every environment) by ID.
func (st *profileStore) list(env string) []rtldProfile {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]rtldProfile, 0, len(st.byID))
	for _, p := range st.byID {
		if env == "" || p.EnvironmentID == env {
			out = append(out, p.clone())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (p rtldProfile) clone() rtldProfile {
	c := p
	c.Fields = slices.Clone(p.Fields)
	c.CustomCookies = slices.Clone(p.CustomCookies)
	c.CustomRequestHeaders = slices.Clone(p.CustomRequestHeaders)
	c.CustomResponseHeaders = slices.Clone(p.CustomResponseHeaders)
	if p.Description != nil {
		d := *p.Description
		c.Description = &d
	}
	if p.DownsamplingPercent != nil {
		d := *p.DownsamplingPercent
		c.DownsamplingPercent = &d
	}
	if p.Filters != nil {
		f := *p.Filters
		f.StatusCodes = slices.Clone(p.Filters.StatusCodes)
		if p.Filters.HostNames != nil {
			h := *p.Filters.HostNames
			h.Names = slices.Clone(h.Names)
			f.HostNames = &h
		}
		c.Filters = &f
	}
	return c
}

// profilePath is the profile's address (@id).
func profilePath(id int64) string {
	return "/rtld/v1/accesslogs/profiles/" + strconv.FormatInt(id, 10)
}

// profileView is the JSON rendering of a profile. Secrets are never part of
// it: authentication carries its type and username only.
type profileView struct {
	AtID                  string           `json:"@id"`
	AtType                string           `json:"@type"`
	ID                    int64            `json:"id"`
	EnvironmentID         string           `json:"environment_id"`
	ProfileName           string           `json:"profile_name"`
	Description           *string          `json:"description,omitempty"`
	Enabled               bool             `json:"enabled"`
	DownsamplingPercent   *float64         `json:"downsampling_percent"`
	Fields                []string         `json:"fields"`
	CustomCookies         []string         `json:"custom_cookies,omitempty"`
	CustomRequestHeaders  []string         `json:"custom_request_headers,omitempty"`
	CustomResponseHeaders []string         `json:"custom_response_headers,omitempty"`
	Filters               *rtldFilters     `json:"filters,omitempty"`
	DeliveryMethod        deliveryViewJSON `json:"delivery_method"`
	CreatedAt             string           `json:"created_at"`
	UpdatedAt             string           `json:"updated_at"`
}

type deliveryViewJSON struct {
	Type                string        `json:"type"`
	DestinationEndpoint string        `json:"destination_endpoint"`
	Authentication      *authViewJSON `json:"authentication,omitempty"`
	LogFormat           string        `json:"log_format"`
}

type authViewJSON struct {
	Type     string `json:"type"`
	Username string `json:"username,omitempty"`
}

func (p rtldProfile) view() profileView {
	v := profileView{
		AtID:                  profilePath(p.ID),
		AtType:                "AccessLogsProfile",
		ID:                    p.ID,
		EnvironmentID:         p.EnvironmentID,
		ProfileName:           p.Name,
		Description:           p.Description,
		Enabled:               p.Enabled,
		DownsamplingPercent:   p.DownsamplingPercent,
		Fields:                p.Fields,
		CustomCookies:         p.CustomCookies,
		CustomRequestHeaders:  p.CustomRequestHeaders,
		CustomResponseHeaders: p.CustomResponseHeaders,
		Filters:               p.Filters,
		DeliveryMethod: deliveryViewJSON{
			Type:                p.Delivery.Type,
			DestinationEndpoint: p.Delivery.DestinationEndpoint,
			LogFormat:           p.Delivery.LogFormat,
		},
		CreatedAt: p.CreatedAt.Format(time.RFC3339),
		UpdatedAt: p.UpdatedAt.Format(time.RFC3339),
	}
	if p.Delivery.AuthType != "" {
		v.DeliveryMethod.Authentication = &authViewJSON{Type: p.Delivery.AuthType, Username: p.Delivery.Username}
	}
	return v
}
