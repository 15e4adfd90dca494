package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// UnmarshalJSON decodes a scenario from a JSON object whose keys are Scenario's exported
// field names, spelled as in Go ("Servers", "Outage", "Churn"). A time.Duration, wherever
// it appears (in Scenario, in a nested struct such as Window, in the elements of a slice
// such as Churn), is a Go duration string: "10s", "1m30s", "500µs" or "500us". Policy,
// Pattern and Balancer are their values as strings ("fail-local", "bursty", "skewed");
// Run checks them. A field the object leaves out keeps its zero value, which Run defaults
// or rejects as it would in Go.
//
// An unknown field, a field given twice, a value of the wrong JSON type, an integer that
// does not fit and a malformed duration are errors that name the field by its path
// ("Churn[1].At") and wrap ErrInvalidScenario. The decoding walks Scenario's fields with
// reflection, so fields added to Scenario or to the structs it holds decode the same way.
func (sc *Scenario) UnmarshalJSON(data []byte) error {
	var out Scenario
	if err := decodeValue(reflect.ValueOf(&out).Elem(), data, ""); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidScenario, err)
	}
	*sc = out
	return nil
}

// MarshalJSON encodes a scenario as UnmarshalJSON reads it: every exported field, in
// declaration order, durations as Go duration strings.
func (sc Scenario) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	if err := encodeValue(&b, reflect.ValueOf(sc), ""); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	scenarioType    = reflect.TypeFor[Scenario]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	marshalerType   = reflect.TypeFor[json.Marshaler]()
)

// fieldError names the field (its path from the top) an error is about.
func fieldError(path string, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path == "" {
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %s", path, msg)
}

// kindOf describes a JSON value by its type, for errors.
func kindOf(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string " + string(raw)
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "the number " + string(raw)
}

// decodeValue sets v, which must be settable, from the JSON value raw; path names v in
// errors.
func decodeValue(v reflect.Value, raw []byte, path string) error {
	t := v.Type()
	isNull := bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
	if t == durationType {
		var s string
		if isNull || json.Unmarshal(raw, &s) != nil {
			return fieldError(path, `want a duration string such as "10s" or "500us", got %s`, kindOf(raw))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fieldError(path, `%q is not a duration (want a Go duration such as "10s", "1m30s" or "500us")`, s)
		}
		v.SetInt(int64(d))
		return nil
	}
	if t != scenarioType && reflect.PointerTo(t).Implements(unmarshalerType) {
		if err := v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(raw); err != nil {
			return fieldError(path, "%v", err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if isNull {
			return nil
		}
		return decodeStruct(v, raw, path)
	case reflect.Pointer:
		if isNull {
			v.SetZero()
			return nil
		}
		p := reflect.New(t.Elem())
		if err := decodeValue(p.Elem(), raw, path); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Slice, reflect.Array:
		if isNull && t.Kind() == reflect.Slice {
			v.SetZero()
			return nil
		}
		var elems []json.RawMessage
		if isNull || json.Unmarshal(raw, &elems) != nil {
			return fieldError(path, "want an array, got %s", kindOf(raw))
		}
		if t.Kind() == reflect.Array && len(elems) != t.Len() {
			return fieldError(path, "want an array of %d, got %d elements", t.Len(), len(elems))
		}
		if t.Kind() == reflect.Slice {
			v.Set(reflect.MakeSlice(t, len(elems), len(elems)))
		}
		for i, e := range elems {
			if err := decodeValue(v.Index(i), e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			break
		}
		if isNull {
			v.SetZero()
			return nil
		}
		members, err := readObject(raw, path)
		if err != nil {
			return err
		}
		m := reflect.MakeMapWithSize(t, len(members))
		for _, mem := range members {
			e := reflect.New(t.Elem()).Elem()
			if err := decodeValue(e, mem.value, fmt.Sprintf("%s[%q]", path, mem.key)); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(mem.key).Convert(t.Key()), e)
		}
		v.Set(m)
		return nil
	}
	return decodeScalar(v, raw, path)
}

// decodeScalar sets a string, boolean or number.
func decodeScalar(v reflect.Value, raw []byte, path string) error {
	t := v.Type()
	var x any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&x); err != nil {
		return fieldError(path, "%v", err)
	}
	var want string // the JSON values the kind holds
	switch t.Kind() {
	case reflect.String, reflect.Bool:
		switch x.(type) {
		case string, bool: // not json.Number, a string type too
			if xv := reflect.ValueOf(x); xv.Kind() == t.Kind() {
				v.Set(xv.Convert(t))
				return nil
			}
		}
		want = "a string"
		if t.Kind() == reflect.Bool {
			want = "true or false"
		}
		return fieldError(path, "want %s, got %s", want, kindOf(raw))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want = "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		want = "an integer >= 0"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	default:
		return fieldError(path, "the scenario decoder does not support fields of type %s", t)
	}
	n, ok := x.(json.Number)
	if !ok {
		return fieldError(path, "want %s, got %s", want, kindOf(raw))
	}
	var err error
	switch s := string(n); t.Kind() {
	case reflect.Float32, reflect.Float64:
		var f float64
		f, err = strconv.ParseFloat(s, t.Bits())
		v.SetFloat(f)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var i int64
		i, err = strconv.ParseInt(s, 10, t.Bits())
		v.SetInt(i)
	default:
		var u uint64
		u, err = strconv.ParseUint(s, 10, t.Bits())
		v.SetUint(u)
	}
	if err != nil {
		return fieldError(path, "%s is not %s that fits %s", n, want, t.Kind())
	}
	return nil
}

// member is one key and value of a JSON object.
type member struct {
	key   string
	value json.RawMessage
}

// readObject splits a JSON object into its members, in order, rejecting a key given twice.
func readObject(raw []byte, path string) ([]member, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, fieldError(path, "want an object, got %s", kindOf(raw))
	}
	var out []member
	seen := map[string]bool{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, fieldError(path, "%v", err)
		}
		key := tok.(string) // inside an object, the decoder yields only string keys here
		var value json.RawMessage
		if err := d.Decode(&value); err != nil {
			return nil, fieldError(path, "%q: %v", key, err)
		}
		if seen[key] {
			return nil, fieldError(path, "field %q is given twice", key)
		}
		seen[key] = true
		out = append(out, member{key, value})
	}
	return out, nil
}

// field is an exported field of a struct, promoted fields of embedded structs included.
type field struct {
	name  string
	index []int
}

// fieldsOf lists the exported fields a JSON object sets on a struct of type t, in
// declaration order. An embedded struct's fields are its own (promoted) names.
func fieldsOf(t reflect.Type) []field {
	var out []field
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() {
			continue
		}
		if f.Anonymous {
			if ft := f.Type; ft.Kind() == reflect.Struct || ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
				continue // its fields follow, promoted
			}
		}
		out = append(out, field{f.Name, f.Index})
	}
	return out
}

// decodeStruct sets a struct's fields from a JSON object.
func decodeStruct(v reflect.Value, raw []byte, path string) error {
	members, err := readObject(raw, path)
	if err != nil {
		return err
	}
	fields := fieldsOf(v.Type())
	for _, mem := range members {
		i := slices.IndexFunc(fields, func(f field) bool { return f.name == mem.key })
		if i < 0 {
			return unknownField(path, mem.key, v.Type(), fields)
		}
		fv, err := v.FieldByIndexErr(fields[i].index)
		if err != nil { // a nil embedded pointer on the way: allocate it
			fv = allocField(v, fields[i].index)
		}
		sub := mem.key
		if path != "" {
			sub = path + "." + mem.key
		}
		if err := decodeValue(fv, mem.value, sub); err != nil {
			return err
		}
	}
	return nil
}

// allocField returns v's field at index, allocating the nil embedded pointers on the way.
func allocField(v reflect.Value, index []int) reflect.Value {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}

// unknownField names the field that was meant, when only its case differs, or lists
// the fields there are.
func unknownField(path, key string, t reflect.Type, fields []field) error {
	var names []string
	for _, f := range fields {
		if strings.EqualFold(f.name, key) {
			return fieldError(path, "unknown field %q (did you mean %q?)", key, f.name)
		}
		names = append(names, f.name)
	}
	return fieldError(path, "unknown field %q: %s has %s", key, t.Name(), strings.Join(names, ", "))
}

// encodeValue writes v as decodeValue reads it.
func encodeValue(b *bytes.Buffer, v reflect.Value, path string) error {
	t := v.Type()
	if t == durationType {
		b.WriteString(strconv.Quote(time.Duration(v.Int()).String()))
		return nil
	}
	if t != scenarioType && t.Implements(marshalerType) {
		out, err := json.Marshal(v.Interface())
		if err != nil {
			return fieldError(path, "%v", err)
		}
		b.Write(out)
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		b.WriteByte('{')
		first := true
		for _, f := range fieldsOf(t) {
			fv, err := v.FieldByIndexErr(f.index)
			if err != nil {
				continue // behind a nil embedded pointer: not set
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(strconv.Quote(f.name) + ":")
			sub := f.name
			if path != "" {
				sub = path + "." + f.name
			}
			if err := encodeValue(b, fv, sub); err != nil {
				return err
			}
		}
		b.WriteByte('}')
		return nil
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteString("null")
			return nil
		}
		return encodeValue(b, v.Elem(), path)
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && v.IsNil() {
			b.WriteString("null")
			return nil
		}
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeValue(b, v.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			break
		}
		if v.IsNil() {
			b.WriteString("null")
			return nil
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(x, y reflect.Value) int { return strings.Compare(x.String(), y.String()) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Quote(k.String()) + ":")
			if err := encodeValue(b, v.MapIndex(k), fmt.Sprintf("%s[%q]", path, k.String())); err != nil {
				return err
			}
		}
		b.WriteByte('}')
		return nil
	case reflect.String, reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		out, err := json.Marshal(v.Interface())
		if err != nil {
			return fieldError(path, "%v", err)
		}
		b.Write(out)
		return nil
	}
	return fieldError(path, "the scenario encoder does not support fields of type %s", t)
}
