package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if a := os.Getenv("EDGEPIPE_PPROF_ADDR"); a != "" {
		go http.ListenAndServe(a, nil)
	}
}
