from egress.cli.entry import main

main()
