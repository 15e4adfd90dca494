package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fill sets every exported field reachable from v (through structs, embedded structs,
// pointers, slices, arrays and maps) to a non-zero value, and fails t on a kind the
// scenario codec does not handle, naming the field: a field added to Scenario later is
// covered by TestScenarioJSONRoundTrip without a change to it.
func fill(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	if v.Type() == durationType {
		v.SetInt(int64(time.Duration(*n) * 1500 * time.Microsecond))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.IsExported() || f.Anonymous && f.Type.Kind() == reflect.Struct {
				fill(t, v.Field(i), path+"."+f.Name, n)
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), path, n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			fill(t, v.Index(i), fmt.Sprintf("%s[%d]", path, i), n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for _, k := range []string{"a", "b"} {
			e := reflect.New(v.Type().Elem()).Elem()
			fill(t, e, path+"["+k+"]", n)
			v.SetMapIndex(reflect.ValueOf(k).Convert(v.Type().Key()), e)
		}
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n%100 + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n%100 + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	default:
		t.Errorf("%s: a field of type %s: teach the scenario codec (scenariojson.go) and fill this kind", path, v.Type())
	}
}

// TestScenarioJSONRoundTrip sets every field of a Scenario, encodes it and decodes it
// again: the same scenario comes back, durations travel as strings.
func TestScenarioJSONRoundTrip(t *testing.T) {
	var sc Scenario
	fill(t, reflect.ValueOf(&sc).Elem(), "Scenario", new(int))
	b, err := json.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"Duration":"`) || !strings.Contains(string(b), `"Outage":{"Start":"`) {
		t.Errorf("durations are not encoded as strings: %s", b)
	}
	var back Scenario
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if !reflect.DeepEqual(sc, back) {
		t.Errorf("round trip changed the scenario:\n%+v\n%+v", sc, back)
	}
}

// The codec's types, nested the ways fields may be added to Scenario: structs in
// structs, slices of structs, pointers, maps, arrays, embedded structs.
type (
	codecInner struct {
		Wait  time.Duration
		Steps []time.Duration
		Label string
	}
	codecEmbedded struct {
		Tuning time.Duration
	}
	codecFixture struct {
		codecEmbedded
		Lease   codecInner
		Stages  []codecInner
		Breaker *codecInner
		ByKey   map[string]codecInner
		Pair    [2]time.Duration
		Ratio   float32
		Count   uint16
		On      bool
		Mode    Policy
		private int
	}
)

// decodeInto and encode run the scenario codec on any type; v is a pointer.
func decodeInto(v any, data string) error {
	return decodeValue(reflect.ValueOf(v).Elem(), []byte(data), "")
}

func encode(v any) (string, error) {
	var b bytes.Buffer
	err := encodeValue(&b, reflect.ValueOf(v).Elem(), "")
	return b.String(), err
}

func TestCodecNestedTypes(t *testing.T) {
	in := `{
		"Tuning": "250us",
		"Lease": {"Wait": "1m30s", "Steps": ["1s", "500µs", "2ms"], "Label": "l"},
		"Stages": [{"Wait": "10ms"}, {"Steps": []}],
		"Breaker": {"Wait": "1h"},
		"ByKey": {"api": {"Wait": "3s"}},
		"Pair": ["1ns", "2ns"],
		"Ratio": 0.5, "Count": 7, "On": true, "Mode": "fail-open"
	}`
	var got codecFixture
	if err := decodeInto(&got, in); err != nil {
		t.Fatal(err)
	}
	want := codecFixture{
		codecEmbedded: codecEmbedded{Tuning: 250 * time.Microsecond},
		Lease:         codecInner{Wait: 90 * time.Second, Steps: []time.Duration{time.Second, 500 * time.Microsecond, 2 * time.Millisecond}, Label: "l"},
		Stages:        []codecInner{{Wait: 10 * time.Millisecond}, {Steps: []time.Duration{}}},
		Breaker:       &codecInner{Wait: time.Hour},
		ByKey:         map[string]codecInner{"api": {Wait: 3 * time.Second}},
		Pair:          [2]time.Duration{1, 2},
		Ratio:         0.5, Count: 7, On: true, Mode: FailOpen,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
	}

	var full codecFixture
	fill(t, reflect.ValueOf(&full).Elem(), "codecFixture", new(int))
	enc, err := encode(&full)
	if err != nil {
		t.Fatal(err)
	}
	var back codecFixture
	if err := decodeInto(&back, enc); err != nil {
		t.Fatalf("%v\n%s", err, enc)
	}
	if !reflect.DeepEqual(full, back) {
		t.Errorf("round trip changed the value:\n%+v\n%+v\n%s", full, back, enc)
	}

	bad := []struct{ in, want string }{
		{`{"Lease": {"Wait": 5}}`, `Lease.Wait: want a duration string`},
		{`{"Lease": {"Steps": ["1s", "2 s"]}}`, `Lease.Steps[1]: "2 s" is not a duration`},
		{`{"Stages": [{}, {"Wiat": "1s"}]}`, `Stages[1]: unknown field "Wiat": codecInner has Wait, Steps, Label`},
		{`{"Breaker": {"Wait": "soon"}}`, `Breaker.Wait: "soon" is not a duration`},
		{`{"ByKey": {"api": {"Label": 3}}}`, `ByKey["api"].Label: want a string, got the number 3`},
		{`{"Tuning": "x"}`, `Tuning: "x" is not a duration`},
		{`{"Pair": ["1s"]}`, `Pair: want an array of 2, got 1 elements`},
		{`{"Count": -1}`, `Count: -1 is not an integer >= 0 that fits uint16`},
		{`{"Count": 70000}`, `Count: 70000 is not an integer >= 0 that fits uint16`},
		{`{"Count": 1.5}`, `Count: 1.5 is not an integer >= 0`},
		{`{"On": "yes"}`, `On: want true or false, got a string "yes"`},
		{`{"Stages": {"Wait": "1s"}}`, `Stages: want an array, got an object`},
		{`{"Lease": "1s"}`, `Lease: want an object, got a string "1s"`},
		{`{"private": 1}`, `unknown field "private"`},
		{`{"codecEmbedded": {}}`, `unknown field "codecEmbedded"`},
		{`{"lease": {}}`, `unknown field "lease" (did you mean "Lease"?)`},
		{`{"On": true, "On": false}`, `field "On" is given twice`},
	}
	for _, c := range bad {
		var v codecFixture
		err := decodeInto(&v, c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", c.in, err, c.want)
		}
	}
}

func TestScenarioJSONErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"Name": "x", "Servres": 20}`, `unknown field "Servres": Scenario has Name, Servers, `},
		{`{"Servers": "20"}`, `Servers: want an integer, got a string "20"`},
		{`{"Servers": 20.5}`, `Servers: 20.5 is not an integer that fits int`},
		{`{"Rate": "fast"}`, `Rate: want a number, got a string "fast"`},
		{`{"Duration": 10}`, `Duration: want a duration string such as "10s" or "500us", got the number 10`},
		{`{"Duration": "10 seconds"}`, `Duration: "10 seconds" is not a duration`},
		{`{"Outage": {"Start": "1s", "Stop": "2s"}}`, `Outage: unknown field "Stop": Window has Start, End`},
		{`{"Outage": {"Start": "1s", "End": "two"}}`, `Outage.End: "two" is not a duration`},
		{`{"Churn": [{"At": "1s", "Servers": 10}, {"At": "2x", "Servers": 20}]}`, `Churn[1].At: "2x" is not a duration`},
		{`{"Churn": [{"At": "1s", "Servers": "all"}]}`, `Churn[0].Servers: want an integer`},
		{`{"Churn": {"At": "1s"}}`, `Churn: want an array, got an object`},
		{`{"Policy": 1}`, `Policy: want a string, got the number 1`},
		{`{"GoModel": "true"}`, `GoModel: want true or false`},
		{`[1, 2]`, `want an object, got an array`},
	}
	for _, c := range cases {
		var sc Scenario
		err := json.Unmarshal([]byte(c.in), &sc)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalidScenario) {
			t.Errorf("%s: err = %v, want ErrInvalidScenario containing %q", c.in, err, c.want)
		}
	}
}
