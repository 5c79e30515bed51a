// Command argocd-health runs an Argo CD resource health check (Lua) as Argo CD does:
// with gopher-lua, the interpreter Argo CD embeds, the object as the global `obj` (maps as
// tables, arrays as 1-based tables), the base, table, string and math libraries (a subset
// of what Argo CD opens), and the returned table read as {status, message}.
//
// Usage: argocd-health SCRIPT.lua < objects.json   (a JSON array of objects)
// Prints a JSON array of {"status": ..., "message": ...}, one per object. Exit 1 when a
// script fails or returns a status Argo CD does not know.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
)

var known = map[string]bool{"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true}

func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch t := v.(type) {
	case map[string]interface{}:
		tbl := l.NewTable()
		for k, e := range t {
			tbl.RawSetString(k, toLua(l, e))
		}
		return tbl
	case []interface{}:
		tbl := l.NewTable()
		for _, e := range t {
			tbl.Append(toLua(l, e))
		}
		return tbl
	case string:
		return lua.LString(t)
	case float64:
		return lua.LNumber(t)
	case bool:
		return lua.LBool(t)
	default:
		return lua.LNil
	}
}

func run(script string, obj map[string]interface{}) (map[string]string, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		l.Push(l.NewFunction(lib.fn))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	out := map[string]string{"status": ret.RawGetString("status").String(), "message": ""}
	if m := ret.RawGetString("message"); m != lua.LNil {
		out["message"] = m.String()
	}
	if !known[out["status"]] {
		return nil, fmt.Errorf("unknown health status %q", out["status"])
	}
	return out, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var objs []map[string]interface{}
	if err := json.NewDecoder(os.Stdin).Decode(&objs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	results := []map[string]string{}
	for i, obj := range objs {
		r, err := run(string(script), obj)
		if err != nil {
			fmt.Fprintf(os.Stderr, "object %d: %v\n", i, err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	_ = json.NewEncoder(os.Stdout).Encode(results)
}
