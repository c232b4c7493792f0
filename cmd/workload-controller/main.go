// Command workload-controller. See README.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "workload-controller: not implemented yet")
	os.Exit(1)
}
