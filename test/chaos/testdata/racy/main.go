// Command racy writes one variable from two goroutines unsynchronised: built with -race, it is a
// child process whose log holds a race report, for the chaos suite's check of such reports.
package main

import "fmt"

func main() {
	n := 0
	done := make(chan bool)
	go func() { n++; done <- true }()
	n++
	<-done
	fmt.Println(n)
}
