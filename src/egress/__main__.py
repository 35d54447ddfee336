from egress.cli.main import main

main()
