package sluicetest_test

import (
	"fmt"
	"testing"
)

// exampleTB is the testing.TB an Example hands to the helpers: an Example
// has no *testing.T, so a failure panics with its message, which fails
// the Example.
type exampleTB struct {
	testing.TB // nil: only the methods below are called
	name       string
}

func tbOf(name string) testing.TB { return exampleTB{name: name} }

func (e exampleTB) Helper()                   {}
func (e exampleTB) Cleanup(func())            {}
func (e exampleTB) Name() string              { return e.name }
func (e exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
