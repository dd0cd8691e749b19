package middleware

import (
	"reflect"
	"strings"
	"testing"
)

// observerMethods returns the methods of Observer.
func observerMethods() []reflect.Method {
	t := reflect.TypeFor[Observer]()
	ms := make([]reflect.Method, t.NumMethod())
	for i := range ms {
		ms[i] = t.Method(i)
	}
	return ms
}

// zeroArgs returns zero values for the arguments of m, an Observer method.
func zeroArgs(m reflect.Method) []reflect.Value {
	args := make([]reflect.Value, m.Type.NumIn())
	for i := range args {
		args[i] = reflect.Zero(m.Type.In(i))
	}
	return args
}

// recordingHooks returns a Hooks whose every field appends its event's name
// to *got.
func recordingHooks(t *testing.T, tag string, got *[]string) *Hooks {
	t.Helper()
	h := &Hooks{}
	v := reflect.ValueOf(h).Elem()
	for _, m := range observerMethods() {
		f := v.FieldByName("On" + m.Name)
		if !f.IsValid() {
			t.Fatalf("Hooks has no field On%s for Observer.%s", m.Name, m.Name)
		}
		name := m.Name
		f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value {
			*got = append(*got, tag+name)
			return nil
		}))
	}
	return h
}

// TestHooksCoverObserver: Hooks has a field On<Event> of the event's
// signature for every Observer method, and each method calls its field
// (and nothing when the field is nil, or the Hooks is nil), so that an
// event added to Observer cannot be forgotten in Hooks.
func TestHooksCoverObserver(t *testing.T) {
	t.Parallel()
	ht := reflect.TypeFor[Hooks]()
	if n, want := ht.NumField(), len(observerMethods()); n != want {
		t.Errorf("Hooks has %d fields for %d Observer methods", n, want)
	}
	for _, m := range observerMethods() {
		f, ok := ht.FieldByName("On" + m.Name)
		if !ok {
			t.Errorf("Hooks has no field On%s", m.Name)
			continue
		}
		if f.Type != m.Type {
			t.Errorf("Hooks.On%s is %v, want %v (Observer.%s)", m.Name, f.Type, m.Type, m.Name)
		}
	}
	var got []string
	h := recordingHooks(t, "", &got)
	for _, m := range observerMethods() {
		got = got[:0]
		reflect.ValueOf(Observer(h)).MethodByName(m.Name).Call(zeroArgs(m))
		if len(got) != 1 || got[0] != m.Name {
			t.Errorf("Hooks.%s called %v, want [%s]", m.Name, got, m.Name)
		}
		// Unset fields and nil Hooks ignore the event.
		reflect.ValueOf(Observer(&Hooks{})).MethodByName(m.Name).Call(zeroArgs(m))
		reflect.ValueOf(Observer((*Hooks)(nil))).MethodByName(m.Name).Call(zeroArgs(m))
		reflect.ValueOf(Observer(NopObserver{})).MethodByName(m.Name).Call(zeroArgs(m))
	}
}

// TestMultiObserverForwards: the fan-out of several Observers passes every
// event to each of them, in order.
func TestMultiObserverForwards(t *testing.T) {
	t.Parallel()
	var got []string
	o := combine([]Observer{recordingHooks(t, "a.", &got), NopObserver{}, recordingHooks(t, "b.", &got)})
	for _, m := range observerMethods() {
		got = got[:0]
		reflect.ValueOf(o).MethodByName(m.Name).Call(zeroArgs(m))
		if want := "a." + m.Name + " b." + m.Name; strings.Join(got, " ") != want {
			t.Errorf("%s reached %v, want %s", m.Name, got, want)
		}
	}
	if combine(nil) != nil {
		t.Error("combine(nil) is not nil")
	}
	one := &Hooks{}
	if combine([]Observer{one}) != Observer(one) {
		t.Error("combine of one Observer is not that Observer")
	}
}
